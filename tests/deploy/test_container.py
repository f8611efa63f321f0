"""The container image, checked without a Docker engine (this machine has none): the build
stage installs the project with pip from a build context that holds every package the wheel
declares and none of the secrets, virtualenvs, data or caches; the persona directory belongs
to the runtime user; and a copy of config.example.env as .env works both locally and in the
image. (tests/test_installed_wheel.py runs the installed wheel with the image's environment.)
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from app.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
EXAMPLE = ROOT / "config.example.env"


def stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), one list per stage."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    found: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            found.append([])
        if line and not line.startswith("#") and found:
            found[-1].append(line)
    return found


def image_env() -> dict[str, str]:
    """The final stage's ENV (``ENV A=1 B=2``), as the gateway sees it in the image."""
    env: dict[str, str] = {}
    for line in stages()[-1]:
        if line.startswith("ENV "):
            for pair in line.split()[1:]:
                name, _, value = pair.partition("=")
                env[name] = value
    return env


def test_build_stage_installs_the_whole_project_with_pip() -> None:
    """The build stage copies the whole context and installs it with pip (so the image holds
    what the package declares, every package included); nothing is copied package by package,
    which is how toolsets/ and providers/ went missing."""
    build, final = stages()
    assert "COPY . ." in build
    assert any("pip install --no-cache-dir ." in line for line in build)
    assert not [line for line in build + final
                if re.match(r"COPY (gateway|channels|providers|toolsets|sessions|app)\b", line)]
    assert "COPY --from=build /opt/gateway /opt/gateway" in final
    assert image_env()["PATH"].startswith("/opt/gateway/bin:")


def test_persona_directory_belongs_to_the_runtime_user() -> None:
    """/data/persona exists in the image, owned by the user the image runs as, so a named
    volume mounted there (compose's shared persona) is writable by it."""
    final = stages()[-1]
    user = next(line.split()[1] for line in final if line.startswith("USER "))
    made = [line for line in final if "install -d" in line]
    assert any(f"-o {user} -g {user}" in line and "/data/persona" in line for line in made)
    assert image_env()["GATEWAY_PERSONA_DIR"] == "/data/persona"


def test_docker_run_example_sets_the_web_token() -> None:
    """The image listens on 0.0.0.0, where the gateway refuses to start without
    GATEWAY_WEB_TOKEN: the `docker run` example in the Dockerfile's header sets it."""
    example = next(line for line in DOCKERFILE.read_text().splitlines()
                   if line.startswith("#   docker run") and "-p 8787:8787" in line)
    assert image_env()["GATEWAY_HOST"] == "0.0.0.0"
    assert "-e GATEWAY_WEB_TOKEN=" in example


# -- the build context (.dockerignore) ------------------------------------------------------


def _pattern(glob: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex over a context-relative path (Go's filepath.Match,
    plus ``**`` for any number of directories)."""
    out = ""
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        elif glob[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif glob[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(glob[i]), i + 1
    return re.compile(out)


def in_context(path: str) -> bool:
    """Whether ``path`` reaches the build context: the last .dockerignore line matching it or
    one of its parent directories decides (a ``!`` line brings it back)."""
    rules = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    kept = True
    for rule in rules:
        negated = rule.startswith("!")
        glob = rule.lstrip("!").strip("/")
        if any(_pattern(glob).fullmatch(prefix) for prefix in prefixes):
            kept = negated
    return kept


def test_build_context_holds_no_secret_virtualenv_data_or_cache() -> None:
    """.env (and its variants), virtualenvs, the data directory, build output and caches
    never reach the build context."""
    for path in (".env", ".env.production", ".venv/bin/python", ".venv-floors/bin/python",
                 "data/persona/SOUL.md", "data/sessions/default/web/x.jsonl",
                 "gateway/__pycache__/cli.cpython-311.pyc", "app/commands/__pycache__/x.pyc",
                 ".mypy_cache/3.11/x.json", ".pytest_cache/v/x", ".ruff_cache/x",
                 ".hypothesis/examples/x", "build/lib/app/cli.py", "dist/gateway.whl",
                 "gateway.egg-info/PKG-INFO", ".git/HEAD", "bench/out/report.md"):
        assert not in_context(path), path


def test_build_context_holds_every_file_the_wheel_needs() -> None:
    """Every tracked file of every package pyproject.toml declares (typing markers and the
    web chat's static files and their licenses included), and the files the build reads."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    tracked = subprocess.run(["git", "ls-files", *packages], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    assert {"toolsets/py.typed", "providers/py.typed", "toolsets/mcp/clock_server.py",
            "channels/web/static/dompurify.LICENSE.txt"} <= set(tracked)
    missing = [path for path in tracked if not in_context(path)]
    assert missing == []
    for path in ("pyproject.toml", "README.md", "LICENSE"):
        assert in_context(path), path


# -- config.example.env copied to .env ------------------------------------------------------


@pytest.fixture
def copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """config.example.env copied to .env in an empty working directory, no GATEWAY_ variable
    set."""
    import os

    for name in list(os.environ):
        if name.startswith(("GATEWAY_", "TELEGRAM_", "SLACK_", "OPENAI_", "ANTHROPIC_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    dotenv = tmp_path / ".env"
    dotenv.write_text(EXAMPLE.read_text())
    return dotenv


def test_example_copied_to_dotenv_changes_no_default_locally(copied: Path) -> None:
    """Locally, the copy is the built-in defaults: nothing in it points at a file the image
    lacks (mcp.example.json) or moves the data, persona or logs."""
    assert Settings(_env_file=copied).model_dump() == Settings(_env_file=None).model_dump()  # type: ignore[call-arg]
    assert Settings(_env_file=copied).mcp_config is None  # type: ignore[call-arg]


def test_example_copied_to_dotenv_keeps_the_image_settings(
        copied: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the image (its ENV set, `.env` passed with --env-file or read from the working
    directory), the copy leaves the image's data directory, persona, JSON logs and address."""
    env = image_env()
    for name, value in env.items():
        if name.startswith("GATEWAY_"):
            monkeypatch.setenv(name, value)
    # --env-file sets every active line as a variable too: the same values win as from .env.
    for line in copied.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            monkeypatch.setenv(name, value)
    settings = Settings(_env_file=copied)  # type: ignore[call-arg]
    assert (settings.data_dir, settings.persona_root, settings.log_format, settings.host,
            settings.port, settings.mcp_config) == (
        Path("/data"), Path("/data/persona"), "json", "0.0.0.0", 8787, None)


def test_example_names_what_compose_needs() -> None:
    """Every variable compose.yaml requires (``${NAME:?...}``) is documented in
    config.example.env, POSTGRES_PASSWORD and REDIS_PASSWORD included."""
    compose = (ROOT / "deploy" / "compose.yaml").read_text()
    required = set(re.findall(r"\$\{(\w+):\?", compose))
    assert {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "GATEWAY_WEB_TOKEN"} <= required
    documented = set(re.findall(r"^#? ?(\w+)=", EXAMPLE.read_text(), flags=re.M))
    assert required <= documented
    yaml.safe_load(compose)  # still a valid compose file


def test_slack_scopes_agree_between_readme_and_example() -> None:
    """The bot scopes in the README's app manifest are the ones config.example.env lists."""
    readme = (ROOT / "README.md").read_text()
    manifest = re.search(r"bot: \[([^\]]*)\]", readme)
    assert manifest is not None
    in_readme = {s.strip() for s in manifest.group(1).split(",")}
    listed = re.search(r"Bot token \(xoxb-\.\.\.\)\. Scopes, [^:]*: ([^.]*)\.",
                       EXAMPLE.read_text().replace("\n# ", " "))
    assert listed is not None
    in_example = {s.strip() for s in listed.group(1).split(",")}
    assert in_readme == in_example
    assert {"chat:write", "users:read", "files:write", "commands"} <= in_readme
