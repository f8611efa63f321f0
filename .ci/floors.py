"""Install the lowest versions pyproject.toml allows, then import everything and run the
provider tests with them: a floor that cannot install or import fails here, not on a user's
machine (``pip install --dry-run`` proves only that the pins resolve).

Run by ``make floors`` (and CI): a second virtualenv, ``.venv-floors``, built once per
pyproject.toml (a stamp holds its hash), so a rerun with unchanged floors only runs the tests.
Every runtime dependency is pinned to its floor (``pkg>=X`` -> ``pkg==X``, extras kept); the
test tools are installed at the versions of the dev extra's floors too.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-floors"
STAMP = VENV / ".floors-stamp"
TESTS = ["tests/gateway/test_providers.py", "tests/e2e/test_provider_replay.py",
         "tests/app/test_telemetry.py", "tests/app/test_logs.py"]
"""The gateway's provider tests (through the SDKs, against the local fake servers), replay of
their requests, live traces and logs. Not ``tests/fakes/test_fake_providers.py``: it checks the
fakes against details of the newest SDKs (``api_message``; a cut OpenAI stream raised as
``APIConnectionError``, which openai 3.0 lets escape as an ``httpx2`` error: the provider
translates both)."""
TEST_TOOLS = ("pytest", "pytest-asyncio", "hypothesis", "opentelemetry-proto")
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
    tools = [r for r in pins(project["optional-dependencies"]["dev"])
             if re.split(r"[\[=<>]", r)[0] in TEST_TOOLS]
    python = VENV / "bin" / "python"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not (STAMP.exists() and STAMP.read_text() == digest):
        print(f"floors: installing {len(runtime)} runtime floors into {VENV.name}", flush=True)
        venv.create(VENV, clear=True, with_pip=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, *runtime, *tools], check=True)
        # The project itself without dependencies: what it needs is exactly the pins above.
        # Its build must not print a deprecation banner (setuptools' license table did).
        # -v: pip shows the build backend's own output (its warnings) only when verbose.
        built = subprocess.run([str(python), "-m", "pip", "install", "-v", "--no-deps",
                                "--no-cache-dir", "--disable-pip-version-check", str(ROOT)],
                               check=True, capture_output=True, text=True)
        banners = [line for line in (built.stdout + built.stderr).splitlines()
                   if "deprecat" in line.lower()]
        if banners:
            sys.exit("floors: installing the project printed deprecation warnings:\n"
                     + "\n".join(banners))
        STAMP.write_text(digest)
    subprocess.run([str(python), "-m", "pip", "check"], check=True)
    # Imported from "/", so from the installed wheel (its package list and data), not the
    # source tree; the tests then run from the source tree, the same code.
    imports = ("import gateway.providers.anthropic, gateway.providers.openai, app.cli, "
               "app.telemetry, channels.telegram.adapter, channels.slack.adapter, "
               "sessions.postgres.store, coordination.redis_coordinator")
    subprocess.run([str(python), "-c", imports], check=True, cwd="/")
    return subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                          cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
