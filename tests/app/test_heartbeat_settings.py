"""GATEWAY_HEARTBEATS is read at start: off when empty, each mistake one ConfigError naming
the item, and a Slack heartbeat must name its workspace (its team id) as its tenant."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from app.compose_schedule import heartbeats
from app.config import Settings
from gateway.edge.errors import ConfigError
from gateway.schedule.heartbeat import Heartbeat


def settings(tmp_path: Path, value: object) -> Settings:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return Settings(_env_file=None, GATEWAY_DATA_DIR=str(tmp_path),  # type: ignore[call-arg]
                    GATEWAY_HEARTBEATS=text)


def test_off_by_default(tmp_path: Path) -> None:
    """No GATEWAY_HEARTBEATS: no heartbeat."""
    assert heartbeats(Settings(_env_file=None, GATEWAY_DATA_DIR=str(tmp_path))) == []  # type: ignore[call-arg]


def test_a_heartbeat_is_read(tmp_path: Path) -> None:
    """Tenant, conversation, minutes and instruction (whitespace folded)."""
    item = {"tenant": "T0123", "conversation": "slack:C0456", "minutes": 45,
            "instruction": "Follow up\n  on open questions."}
    assert heartbeats(settings(tmp_path, [item])) == [
        Heartbeat("T0123", "slack", "C0456", 45.0, "Follow up on open questions.")]


@pytest.mark.parametrize(("value", "message"), [
    ("[{", "GATEWAY_HEARTBEATS is not JSON"),
    ({"minutes": 5}, "GATEWAY_HEARTBEATS is a JSON list of objects"),
    ([{"conversation": "C0456", "minutes": 5, "instruction": "x"}],
     "item 1: conversation is CHANNEL:CHAT"),
    ([{"conversation": "telegram:-100", "minutes": 0.5, "instruction": "x"}],
     "item 1: minutes is a number >= 1"),
    ([{"conversation": "telegram:-100", "minutes": 5}], "item 1: instruction is required"),
    ([{"conversation": "slack:C0456", "minutes": 5, "instruction": "x"}],
     "item 1: a Slack schedule belongs to its workspace: the tenant is its team id (T...), "
     "not 'default'"),
])
def test_mistakes_are_one_config_error(tmp_path: Path, value: object, message: str) -> None:
    """Each mistake is refused at start with the item and what is wrong."""
    with pytest.raises(ConfigError) as caught:
        heartbeats(settings(tmp_path, value))
    assert message in str(caught.value)
