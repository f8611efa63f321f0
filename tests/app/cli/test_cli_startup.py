"""The ``gateway`` command starts without importing what only running needs: ``--version`` and
``--help`` import no command module at all, and every command's options (what ``COMMAND
--help`` and a completing shell need) are defined without importing an SDK, the server, the
settings or the composition root. Structural, not timed: bench/bench_cli_startup.py times it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

HEAVY = ("anthropic", "openai", "telegram", "slack_bolt", "slack_sdk", "aiohttp", "mcp",
         "asyncpg", "redis", "opentelemetry", "pydantic", "pydantic_settings", "rich", "PIL",
         "httpx2", "prometheus_client", "app.compose", "app.compose_channels", "app.config",
         "app.server", "providers", "channels", "toolsets", "coordination")
"""Modules that cost most of a second to import (the SDKs, the server and what picks them):
none belongs to starting the command line."""

PROBE = """
import json, sys
from app.cli import build_parser, main

def loaded():
    return sorted(sys.modules)

try:
    main(sys.argv[1:])
except SystemExit:
    pass
after_cli = loaded()
build_parser()  # every command's module imported and every option defined
print(json.dumps({"cli": after_cli, "every_parser": loaded()}))
"""


def modules_after(*argv: str, env: dict[str, str] | None = None) -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, check=True,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    loaded: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def heavy_in(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(f"{h}.") for h in HEAVY)]


def test_version_imports_no_command_and_no_sdk() -> None:
    """After ``gateway --version`` nothing heavy is loaded, no command module but the shared
    helpers, and not even asyncio; defining every command's options loads nothing heavy."""
    loaded = modules_after("--version")
    assert heavy_in(loaded["cli"]) == []
    assert [m for m in loaded["cli"] if m.startswith("app.commands.")] == ["app.commands.common"]
    assert "asyncio" not in loaded["cli"]
    assert heavy_in(loaded["every_parser"]) == []


def test_help_imports_nothing_heavy() -> None:
    """``gateway --help`` lists every command without importing one."""
    loaded = modules_after("--help")
    assert heavy_in(loaded["cli"]) == []
    assert [m for m in loaded["cli"] if m.startswith("app.commands.")] == ["app.commands.common"]


COMPLETION_PROBE = """
import json, os, sys
import argcomplete
from app.cli import main

answer = argcomplete.autocomplete

def noting_modules(parser, **options):
    # The parser is built: note what it took, then let argcomplete answer the shell (it
    # leaves with os._exit, so nothing after it runs).
    with open(os.environ["PROBE_MODULES"], "w") as out:
        json.dump(sorted(sys.modules), out)
    answer(parser, **options)

argcomplete.autocomplete = noting_modules
main([])
"""


def test_completing_a_command_imports_only_that_command(tmp_path: Path) -> None:
    """A shell completing ``gateway replay --`` gets replay's options, and only replay's
    module (and what it shares) is imported for it, no SDK."""
    answer, modules = tmp_path / "completions", tmp_path / "modules.json"
    line = "gateway replay --"
    env = {"_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "COMP_TYPE": "9", "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
           "_ARGCOMPLETE_IFS": " ", "PROBE_MODULES": str(modules)}
    subprocess.run([sys.executable, "-c", COMPLETION_PROBE], cwd=ROOT, check=True,
                   env={**os.environ, **env}, capture_output=True, timeout=120,
                   stdin=subprocess.DEVNULL)
    assert "--request" in answer.read_text().split()
    imported = json.loads(modules.read_text())
    assert heavy_in(imported) == []
    commands = {m for m in imported if m.startswith("app.commands.")}
    assert "app.commands.replay" in commands
    assert not commands & {"app.commands.export", "app.commands.run", "app.commands.viewer"}
