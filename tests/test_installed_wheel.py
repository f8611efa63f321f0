"""The package as it ships: the wheel is built from the container's build context (the files
.dockerignore lets through, as `docker build` would send them), installed into a clean
virtualenv, and its `gateway` console script runs with the image's environment (non-loopback
address and web token, JSON logs, data and persona directories) and every optional part on:
an MCP stdio server (the example clock, started from the installed package), the PostgreSQL
session store (its tables made by the installed `gateway db upgrade`), Redis coordination and
an OTLP endpoint. It answers a message that takes a tool round, traces it, and exits 0 on
SIGTERM. A package the wheel does not declare (toolsets/ once) fails here by name.

The virtualenv is made without pip and sees the dev venv's site-packages through a path file,
so the third-party dependencies are the ones `make` installed (no network, no resolver run);
the dev venv's path files are not processed there, so its editable install of the project is
invisible: the project's own modules can only come from the wheel.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import venv
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.app.test_telemetry import Receiver
from tests.coordination.services import REDIS_URL, delete_prefix, new_prefix, redis_client
from tests.deploy.test_container import image_env, in_context
from tests.sessions.pg import PG_URL, create_schema, drop_schema
from tests.toolsets.mcp.harness import eventually

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "channels", "providers", "sessions", "coordination", "toolsets", "app")
TOKEN = "wheel-test-token-0123456789abcdef"


def build_context(into: Path) -> None:
    """Copy what `docker build` would send (the files .dockerignore lets through)."""
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder).relative_to(ROOT)
        dirs[:] = [d for d in dirs if in_context(str(here / d))]
        for name in files:
            path = here / name
            if in_context(str(path)):
                (into / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / path, into / path)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean virtualenv with the freshly built wheel installed; yields its bin/."""
    work = tmp_path_factory.mktemp("wheel")
    source, wheels, env = work / "context", work / "wheels", work / "venv"
    source.mkdir()
    build_context(source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-cache-dir", "--disable-pip-version-check", "-q", "-w", str(wheels),
                    str(source)], check=True, timeout=300, cwd=work)
    (wheel,) = wheels.glob("gateway-*.whl")
    venv.create(env, with_pip=False)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(env),
                                                       "platbase": str(env)}))
    dev = Path(sysconfig.get_path("purelib"))
    (purelib / "dev-dependencies.pth").write_text(f"{dev}\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"),
                    "install", "--no-deps", "--no-index", "--disable-pip-version-check", "-q",
                    str(wheel)], check=True, timeout=300, cwd=work)
    return env / "bin"


def test_every_package_comes_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    """Each of the project's packages imports in the virtualenv, from its site-packages (not
    the source tree, not the dev venv's editable install), typing markers included; the
    wheel's license expression and files cover what it bundles."""
    probe = ("import importlib, json, sys, pathlib\n"
             "out = {}\n"
             "for name in sys.argv[1:]:\n"
             "    module = importlib.import_module(name)\n"
             "    folder = pathlib.Path(module.__file__).parent\n"
             "    out[name] = [str(folder), (folder / 'py.typed').exists()]\n"
             "print(json.dumps(out))\n")
    done = subprocess.run([str(installed / "python"), "-c", probe, *PACKAGES,
                           "toolsets.mcp.clock_server"], cwd=tmp_path, capture_output=True,
                          text=True, check=False, timeout=120, env=_clean_env())
    assert done.returncode == 0, done.stderr
    found = orjson.loads(done.stdout)
    site = str(installed.parent / "lib")
    # The license of what the wheel bundles: DOMPurify's and markdown-it's texts beside ours.
    meta = subprocess.run([str(installed / "python"), "-c", LICENSE_PROBE], cwd=tmp_path,
                          capture_output=True, text=True, check=True, timeout=120,
                          env=_clean_env())
    expression, *files = meta.stdout.splitlines()
    assert expression == "MIT AND (Apache-2.0 OR MPL-2.0)"
    assert {Path(f).name for f in files} >= {"LICENSE", "dompurify.LICENSE.txt",
                                             "markdown-it.LICENSE.txt"}
    for name in PACKAGES:
        folder, typed = found[name]
        assert folder.startswith(site), (name, folder)
        assert typed, f"{name} has no py.typed"


LICENSE_PROBE = """
from importlib import metadata
dist = metadata.distribution("gateway")
print(dist.metadata["License-Expression"])
for name in dist.metadata.get_all("License-File") or []:
    print(name)
"""


def _clean_env() -> dict[str, str]:
    """This process's environment without settings, so only what the test sets applies."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("GATEWAY_", "OTEL_", "PYTHON", "OPENAI_", "ANTHROPIC_",
                                 "TELEGRAM_", "SLACK_"))}


@pytest.fixture
async def otlp() -> AsyncIterator[tuple[Receiver, str]]:
    from aiohttp import web

    got = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", got.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield got, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def services() -> AsyncIterator[tuple[str, str]]:
    """A fresh PostgreSQL schema (not yet migrated) and Redis key prefix."""
    client = await redis_client()
    schema = await create_schema(migrate=False)
    prefix = new_prefix()
    try:
        yield schema, prefix
    finally:
        await drop_schema(schema)
        await delete_prefix(client, prefix)
        await client.aclose()


async def _listening_port(stderr: asyncio.StreamReader, seen: list[str]) -> int:
    """Read the JSON log until the gateway says where it listens."""
    while True:
        line = (await stderr.readline()).decode()
        if not line:
            raise AssertionError("gateway exited before listening:\n" + "".join(seen))
        seen.append(line)
        found = re.search(r"gateway listening on http://[^:]+:(\d+)", line)
        if found:
            return int(found.group(1))


async def test_installed_gateway_runs_with_everything_on(
        installed: Path, tmp_path: Path, otlp: tuple[Receiver, str],
        services: tuple[str, str]) -> None:
    """`gateway db upgrade` then `gateway run` from the wheel, with the image's environment and
    MCP, PostgreSQL, Redis and OTLP on: /healthz is ok, a message whose answer calls the MCP
    clock is answered with the clock's time, the turn reaches the OTLP receiver, and SIGTERM
    ends the process with status 0 and no traceback."""
    receiver, endpoint = otlp
    schema, prefix = services
    data = tmp_path / "data"
    mcp = tmp_path / "mcp.json"
    mcp.write_text((ROOT / "mcp.example.json").read_text())
    image = image_env()
    env = {
        **_clean_env(),
        **{k: v for k, v in image.items() if k.startswith("GATEWAY_")},
        # The image's /data, here: the same layout under this test's directory.
        "GATEWAY_DATA_DIR": str(data), "GATEWAY_PERSONA_DIR": str(data / "persona"),
        "GATEWAY_PORT": "0", "GATEWAY_WEB_TOKEN": TOKEN,
        "GATEWAY_PROVIDER": "offline", "GATEWAY_MCP_CONFIG": str(mcp),
        "GATEWAY_MCP_START_TIMEOUT": "120",
        "GATEWAY_STORE_URL": PG_URL, "GATEWAY_STORE_SCHEMA": schema,
        "GATEWAY_REDIS_URL": REDIS_URL, "GATEWAY_REDIS_PREFIX": prefix,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    assert env["GATEWAY_HOST"] == "0.0.0.0"
    assert env["GATEWAY_LOG_FORMAT"] == "json"
    upgraded = await asyncio.to_thread(
        subprocess.run, [str(installed / "gateway"), "db", "upgrade"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120, check=False)
    assert upgraded.returncode == 0, upgraded.stderr
    gateway = await asyncio.create_subprocess_exec(
        str(installed / "gateway"), "run", cwd=tmp_path, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert gateway.stderr is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(180):
            port = await _listening_port(gateway.stderr, seen)
        base = f"http://127.0.0.1:{port}"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as resp:
                health = await resp.json()
                assert resp.status == 200, health
            assert health["mcp"]["clock"]["status"] == "up", health
            async with http.post(f"{base}/api/chat", headers=auth, json={
                    "conversation": "wheel", "text": "what time is it?"}) as resp:
                answer = await resp.json()
                assert resp.status == 200, answer
        assert "(UTC)" in answer["reply"], answer
        # The batch exporter sends within OTEL_BSP_SCHEDULE_DELAY; the receiver has no event.
        await eventually(lambda: any(span.name.startswith("invoke_agent")
                                     for span in receiver.spans))
    finally:
        if gateway.returncode is None:
            gateway.send_signal(signal.SIGTERM)
        async with asyncio.timeout(120):
            rest = await gateway.stderr.read()
            code = await gateway.wait()
    log = "".join(seen) + rest.decode()
    assert code == 0, log
    assert "Traceback" not in log
    for line in log.splitlines():
        assert orjson.loads(line)["level"] != "ERROR", line  # JSON logs, as in the image
