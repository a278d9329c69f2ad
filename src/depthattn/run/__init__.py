"""A run on disk, the mechanism: its folder's lock (``lock``), its trainer state (``state``). This package never
imports ``depthattn.training`` (which decides *when* to save and *what* may continue a run)."""
