"""Install the lowest versions pyproject.toml allows, then import everything and run the
provider and channel tests with them: a floor that cannot install or import fails here, not on
a user's machine (``pip install --dry-run`` proves only that the pins resolve).

Run by ``make floors`` (and CI): a second virtualenv, ``.venv-floors``, whose dependencies are
installed once per list of pins (a stamp holds its hash); the project's own wheel is rebuilt
and reinstalled every run.
Every runtime dependency is pinned to its floor (``pkg>=X`` -> ``pkg==X``, extras kept); the
test tools are installed at the versions of the dev extra's floors too.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-floors"
STAMP = VENV / ".floors-stamp"
TESTS = ["tests/gateway/test_providers.py", "tests/e2e/test_provider_replay.py",
         "tests/app/test_telemetry.py", "tests/app/test_logs.py",
         "tests/app/test_provider_check.py", "tests/channels"]
"""The gateway's provider tests (through the SDKs, against the local fake servers), replay of
their requests, the start-up check of their keys, live traces and logs, and the channel tests
(Telegram through PTB, Slack through bolt and slack_sdk, Socket Mode included, against the
local fake platforms). Not ``tests/fakes/test_fake_providers.py``: it checks the fakes against
details of the newest SDKs (``api_message``; a cut OpenAI stream raised as
``APIConnectionError``, which openai 3.0 lets escape as an ``httpx2`` error: the provider
translates both)."""
TEST_TOOLS = ("pytest", "pytest-asyncio", "hypothesis", "opentelemetry-proto")
IMPORT_ALL = """
import importlib, pkgutil, sys
for package in sys.argv[1:]:
    root = importlib.import_module(package)
    assert "site-packages" in root.__file__, root.__file__
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
"""
_FLOOR = re.compile(r"^\s*([A-Za-z0-9_.\-]+(?:\[[^\]]+\])?)\s*>=\s*([0-9][^,;\s]*)")


def pins(requirements: list[str]) -> list[str]:
    """``name[extra]>=X,<Y`` -> ``name[extra]==X``; a requirement without a floor is kept."""
    pinned = []
    for requirement in requirements:
        match = _FLOOR.match(requirement)
        pinned.append(f"{match.group(1)}=={match.group(2)}" if match else requirement)
    return pinned


def main() -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = pins(project["dependencies"])
    # pytest and every pytest plugin (the ini options may need one), plus the named tools.
    tools = [r for r in pins(project["optional-dependencies"]["dev"])
             if (name := re.split(r"[\[=<>]", r)[0]) in TEST_TOOLS or name.startswith("pytest")]
    python = VENV / "bin" / "python"
    # The stamp is the list installed, so a changed floor or test tool reinstalls.
    digest = hashlib.sha256("\n".join([*runtime, *tools]).encode()).hexdigest()
    if not (STAMP.exists() and STAMP.read_text() == digest):
        print(f"floors: installing {len(runtime)} runtime floors into {VENV.name}", flush=True)
        venv.create(VENV, clear=True, with_pip=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, *runtime, *tools], check=True)
        STAMP.write_text(digest)
    # The project itself, rebuilt every run (the source changes more often than the floors),
    # without dependencies: what it needs is exactly the pins above. Its build must not print
    # a deprecation banner (setuptools' license table did); -v, because pip shows the build
    # backend's own output only when verbose.
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # no stale module from an earlier build
    built = subprocess.run([str(python), "-m", "pip", "install", "-v", "--no-deps",
                            "--force-reinstall", "--no-cache-dir",
                            "--disable-pip-version-check", str(ROOT)],
                           check=True, capture_output=True, text=True)
    banners = [line for line in (built.stdout + built.stderr).splitlines()
               if "deprecat" in line.lower()]
    if banners:
        sys.exit("floors: installing the project printed deprecation warnings:\n"
                 + "\n".join(banners))
    subprocess.run([str(python), "-m", "pip", "check"], check=True)
    # Every module of the installed wheel, imported from "/" (so from the wheel, not the
    # source tree): an undeclared or too-old dependency fails here by name.
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["packages"]
    subprocess.run([str(python), "-c", IMPORT_ALL, *packages], check=True, cwd="/")
    return subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                          cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
