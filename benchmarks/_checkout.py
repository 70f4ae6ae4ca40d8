"""Imported first by the scripts in this folder: puts this checkout's `tram` ahead of any other one
installed in the environment (an editable install of another worktree, say), so that a script
measures the code that stands beside it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
