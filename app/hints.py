"""Commands the product prints for the operator to run (the web page's and the terminal chat's
replay hint, the pairing code's approval, "run `gateway db upgrade`"), spelled as they work
when pasted into the shell that started this process.

``gateway`` is only on ``PATH`` inside an activated virtualenv or an image; after ``make run``
it is ``.venv/bin/gateway``. :func:`cli_command` answers how this process's own ``gateway``
command is reached from its working directory: the bare name when ``PATH`` finds this very
script, else the script's path (relative to the working directory when inside it), else this
interpreter with ``-m gateway``.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

from sessions.names import DEFAULT_TENANT

DEFAULT_DATA_DIR = Path("./data")
_BARE = re.compile(r"`gateway ")


def cli_command() -> str:
    """The ``gateway`` command as the operator types it here (see the module docstring)."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "gateway" and argv0.is_file():
        script: Path | None = argv0
    else:  # python -m gateway (make run), python -m app, or a test runner
        beside = Path(sys.executable).parent / "gateway"
        script = beside if beside.is_file() else None
    if script is None:
        return f"{shlex.quote(_shown(Path(sys.executable)))} -m gateway"
    found = shutil.which("gateway")
    if found is not None and Path(found).resolve() == script.resolve():
        return "gateway"
    return shlex.quote(_shown(script))


def replay_hint(data_dir: Path, tenant: str = DEFAULT_TENANT) -> str:
    """``<gateway> replay {session}`` (a format string), with ``--tenant`` when the sessions
    are not the default tenant's (the web chat's are ``web``'s) and ``--data-dir`` when they
    are not in the default ``./data``."""
    hint = f"{cli_command()} replay {{session}}"
    if tenant != DEFAULT_TENANT:
        hint += f" --tenant {shlex.quote(tenant)}"
    if data_dir != DEFAULT_DATA_DIR:
        hint += f" --data-dir {shlex.quote(str(data_dir))}"
    return hint


def as_typed(text: str) -> str:
    """``text`` with each quoted `` `gateway ...` `` command spelled as :func:`cli_command`."""
    command = cli_command()
    return text if command == "gateway" else _BARE.sub(f"`{command} ", text)


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is inside it (``.venv/bin/...``),
    else absolute."""
    absolute = path.absolute()
    try:
        relative = absolute.relative_to(Path.cwd())
    except ValueError:
        return str(absolute)
    # A bare name would be looked up on PATH: a script in the working directory is ./name.
    return str(relative) if len(relative.parts) > 1 else f"./{relative}"
