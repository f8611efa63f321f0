"""``gateway run`` warns at start about a ``.env`` other users can read, without its values."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SECRET = "sk-ant-do-not-print-me-0123456789"


async def start_lines(cwd: Path) -> list[str]:
    """What ``gateway run`` (started in ``cwd``) logs up to its "listening" line; then it is
    stopped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "ANTHROPIC_",
                                                                     "OPENAI_"))}
    env["PYTHONPATH"] = str(ROOT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "run", cwd=cwd, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(60):
            while "listening on" not in (lines[-1] if lines else ""):
                line = (await proc.stderr.readline()).decode()
                assert line, "".join(lines)
                lines.append(line)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await proc.communicate()
    return lines


@pytest.mark.parametrize(("mode", "warned"), [(0o644, True), (0o640, True), (0o600, False)])
async def test_a_readable_env_file_is_warned_about(tmp_path: Path, mode: int,
                                                   warned: bool) -> None:
    """With a .env of mode 0644 (or 0640) the start logs one warning naming the file and the
    fix, never a value in it; with 0600 none (the gateway is listening either way)."""
    dotenv = tmp_path / ".env"
    dotenv.write_text(f"GATEWAY_PORT=0\nGATEWAY_CHANNELS=web\nGATEWAY_DATA_DIR={tmp_path}/d\n"
                      f"GATEWAY_PROVIDER=offline\nANTHROPIC_API_KEY={SECRET}\n")
    dotenv.chmod(mode)
    lines = await start_lines(tmp_path)
    warnings = [line for line in lines if "chmod 600 .env" in line]
    assert len(warnings) == int(warned), lines
    assert not any(SECRET in line for line in lines)
