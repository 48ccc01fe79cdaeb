"""Host suite: no VM, no /dev/obmm. Puts tests/host on sys.path for its helper modules."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
