"""The commands the product prints work as printed: `gateway --help`'s common tasks and a
failure's suggested command are spelled as the operator reaches this `gateway` from the working
directory (`.venv/bin/gateway` after `make run`, `gateway` when PATH finds it, the absolute
path elsewhere), and each spelling runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "gateway"


def run(argv: list[str] | str, cwd: Path,
        path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["PATH"] = path if path is not None else "/usr/bin:/bin"
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False, shell=isinstance(argv, str))


def advertised(help_text: str) -> str:
    """The command `--help` tells the operator to run (its completion line)."""
    found = re.search(r'eval "\$\((.+) completion bash\)"', help_text)
    assert found is not None, help_text
    return found.group(1)


@pytest.mark.parametrize("where", ["project", "elsewhere", "on PATH"])
def test_help_spells_the_command_as_it_runs_here(where: str, tmp_path: Path) -> None:
    """From the project (`.venv/bin/gateway`), from another directory (its absolute path) and
    with the venv on PATH (`gateway`), `--help` names the command as it works there, and the
    name printed runs as printed."""
    if not SCRIPT.is_file():
        pytest.fail(f"no console script beside {sys.executable}: the package is not installed")
    cwd = ROOT if where == "project" else tmp_path
    path = f"{SCRIPT.parent}:/usr/bin:/bin" if where == "on PATH" else None
    shown = run([str(SCRIPT), "--help"], cwd, path)
    assert shown.returncode == 0, shown.stderr
    command = advertised(shown.stdout)
    expected = {"project": os.path.relpath(SCRIPT, ROOT), "elsewhere": str(SCRIPT),
                "on PATH": "gateway"}[where]
    assert command == expected
    assert f"  {command} replay ID --call 2" in shown.stdout
    works = run(f"{command} --version", cwd, path)
    assert (works.returncode, works.stdout.startswith("gateway ")) == (0, True), works.stderr


def test_a_suggested_command_in_a_failure_is_spelled_as_typed(tmp_path: Path) -> None:
    """A one-line failure that suggests a `gateway ...` command names it as it runs here."""
    from app.hints import as_typed, cli_command

    message = as_typed("schema 'x' is at version 0; run `gateway db upgrade`")
    assert message == f"schema 'x' is at version 0; run `{cli_command()} db upgrade`"
    assert as_typed("no command here") == "no command here"
