"""The deployment examples in deploy/, checked as far as this machine allows: it has no Docker
engine and no systemd as PID 1, so nothing is started. The compose file parses with the
expected services and wiring, the load balancer lists both workers and looks them up again
while it runs (and `haproxy -c` accepts it where HAProxy is installed), and the systemd unit
passes `systemd-analyze verify` and rates well below the 6.7 it had (`systemd-analyze security
--offline`). The image itself: tests/deploy/test_container.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.capabilities import missing

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
WORKERS = ("worker1", "worker2")


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_compose_has_the_services_and_their_wiring() -> None:
    """PostgreSQL, Redis, a one-shot migration, two workers and a load balancer; the workers
    share the store and Redis, start after the migration, and only the balancer is published."""
    services = compose()["services"]
    assert set(services) == {"postgres", "redis", "migrate", *WORKERS, "lb"}
    for name in WORKERS:
        worker = services[name]
        env = worker["environment"]
        assert env["GATEWAY_STORE_URL"].startswith("postgresql://gateway:${POSTGRES_PASSWORD")
        assert env["GATEWAY_STORE_URL"].endswith("@postgres:5432/gateway")
        assert env["GATEWAY_REDIS_URL"].endswith("@redis:6379/0")
        assert worker["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        assert worker["build"]["dockerfile"] == "deploy/Dockerfile"
        assert "ports" not in worker
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["lb"]["ports"] == ["8787:8787"]
    assert set(services["lb"]["depends_on"]) == set(WORKERS)


def test_workers_keep_the_image_locations_and_need_a_web_token() -> None:
    """Whatever .env says, the workers keep the image's data directory, shared persona volume
    and JSON logs; they listen off loopback, so compose refuses to start without
    GATEWAY_WEB_TOKEN (the gateway would refuse anyway, one worker at a time)."""
    spec = compose()
    for name in WORKERS:
        worker = spec["services"][name]
        env = worker["environment"]
        assert (env["GATEWAY_DATA_DIR"], env["GATEWAY_PERSONA_DIR"], env["GATEWAY_LOG_FORMAT"]) \
            == ("/data", "/data/persona", "json")
        assert env["GATEWAY_WEB_TOKEN"].startswith("${GATEWAY_WEB_TOKEN:?")
        assert "persona:/data/persona" in worker["volumes"]
    assert "persona" in spec["volumes"]


def test_load_balancer_is_on_a_supported_long_term_branch() -> None:
    """HAProxy's image is a long-term-support branch (even minor, 3.0 or later: 2.9 was a
    short-lived branch past its end of life)."""
    image = compose()["services"]["lb"]["image"]
    name, _, tag = image.partition(":")
    major, minor = (int(part) for part in tag.split(".")[:2])
    assert name == "haproxy"
    assert (major, minor) >= (3, 0)
    assert minor % 2 == 0, image


def test_compose_holds_no_secret() -> None:
    """Passwords come from the environment (${...:?}), never written in the file."""
    text = (DEPLOY / "compose.yaml").read_text()
    for line in text.splitlines():
        if re.search(r"PASSWORD\s*:", line):
            assert "${" in line, line
    assert not re.search(r"://gateway:[^$]", text)


def test_load_balancer_hashes_conversations_over_both_workers() -> None:
    """HAProxy's affinity backend hashes the conversation key and lists every worker."""
    config = (DEPLOY / "haproxy.cfg").read_text()
    assert "balance hash var(txn.conversation)" in config
    assert "hash-type consistent" in config
    for name in WORKERS:
        assert re.search(rf"server {name} {name}:8787 check", config)


def test_load_balancer_resolves_workers_again() -> None:
    """Every server names a `resolvers` section that exists (so a recreated worker's new
    address is found), and starts even while a worker's name does not resolve yet."""
    config = (DEPLOY / "haproxy.cfg").read_text()
    sections = set(re.findall(r"^resolvers (\S+)$", config, flags=re.M))
    servers = re.findall(r"^\s*server .*$", config, flags=re.M)
    assert sections
    assert len(servers) == 2 * len(WORKERS)
    for line in servers:
        named = re.search(r"\bresolvers (\S+)", line)
        assert named is not None, line
        assert named.group(1) in sections
        init = re.search(r"\binit-addr (\S+)", line)
        assert init is not None, line
        assert "none" in init.group(1).split(","), line


def test_haproxy_accepts_the_configuration() -> None:
    """`haproxy -c` finds the file valid (the workers' names need not resolve here)."""
    tool = shutil.which("haproxy")
    if tool is None:
        missing("haproxy is not installed (Debian: apt-get install haproxy)")
    result = subprocess.run([tool, "-c", "-f", str(DEPLOY / "haproxy.cfg")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_dockerfile_is_slim_non_root_with_the_console_script() -> None:
    """Slim base images, a non-root user, the `gateway` console script as entry point, and a
    health check on /healthz."""
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines()]
    froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert froms
    assert all(base.endswith("-slim") for base in froms)
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users == ["gateway"]
    assert 'ENTRYPOINT ["gateway"]' in lines
    assert 'CMD ["run"]' in lines
    assert any("/healthz" in line for line in lines)


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts the unit with no warning, in a throw-away root that
    holds the system's unit files, the executable and the environment file it names."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        missing("systemd-analyze is not installed (Debian: apt-get install systemd)")
    units = next((p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))
                  if p.is_dir()), None)
    if units is None:
        missing("no system unit directory to verify against (Debian: apt-get install systemd)")
    root = tmp_path / "root"
    shutil.copytree(units, root / "usr/lib/systemd/system", symlinks=True)
    (root / "opt/gateway/bin").mkdir(parents=True)
    executable = root / "opt/gateway/bin/gateway"
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o755)
    (root / "etc/gateway").mkdir(parents=True)
    (root / "etc/gateway/gateway.env").write_text("")
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copy(DEPLOY / "gateway.service", root / "etc/systemd/system/gateway.service")
    result = subprocess.run([tool, "verify", f"--root={root}",
                             "/etc/systemd/system/gateway.service"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")


def test_systemd_unit_is_hardened() -> None:
    """`systemd-analyze security --offline` rates the unit 2.0 or better (it was 6.7 MEDIUM),
    and the settings the gateway cannot run without are left alone: network sockets, and the
    state directory it writes."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        missing("systemd-analyze is not installed (Debian: apt-get install systemd)")
    unit = DEPLOY / "gateway.service"
    result = subprocess.run([tool, "security", "--offline=yes", "--threshold=20", str(unit)],
                            capture_output=True, text=True, timeout=60, check=False)
    level = re.search(r"Overall exposure level for gateway.service: ([0-9.]+)", result.stdout)
    assert level is not None, result.stdout + result.stderr
    assert (result.returncode, float(level.group(1)) <= 2.0) == (0, True), level.group(0)
    text = unit.read_text()
    assert "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX" in text
    assert "StateDirectory=gateway" in text
    assert "PrivateNetwork" not in text
