"""Private files: every file the gateway keeps under its data folder is 0600 in a 0700 folder.

Session logs, dedup journals and pairing state hold what people wrote; only the gateway's user
may read them, whatever the umask.
"""

from __future__ import annotations

import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) as 0700, tightening it if it already exists looser."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode != DIR_MODE:
        path.chmod(DIR_MODE)
    return path
