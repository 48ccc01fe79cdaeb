"""`python -m obmm.bench`: the same as `obmm-testbed bench`."""

from __future__ import annotations

import sys

from obmm.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
