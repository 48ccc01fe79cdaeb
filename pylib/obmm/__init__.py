"""obmm-testbed: bindings, tools and testbed for openEuler's OBMM UAPI."""

from __future__ import annotations

__version__ = "0.1.0"
