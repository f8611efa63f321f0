"""The deployment examples in deploy/, checked as far as this machine allows: it has no Docker
engine, HAProxy or systemd as PID 1, so nothing is started. The compose file parses with the
expected services and wiring, the Dockerfile runs the console script as a non-root user, the
load balancer lists both workers, and the systemd unit passes `systemd-analyze verify`."""

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
