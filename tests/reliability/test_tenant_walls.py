"""Tenants a stranger cannot reach or reveal, against a real running gateway: a signed Slack
event naming a tenant the gateway names itself is ignored, and ``/metrics`` labels carry no
Slack team id.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.support import session_files, wait_until
from tests.reliability.test_bad_input import SLACK_USER, metric, running_stack


@pytest.mark.parametrize("team", ["default", "web", "t0lower", "T0../x"])
async def test_a_signed_slack_event_cannot_name_a_tenant_of_the_gateway(
        tmp_path: Path, team: str) -> None:
    """An allowlisted user's signed DM whose every team field says ``default`` (or ``web``, or
    anything not shaped like a Slack team id) is acknowledged and dropped: no session; the same
    DM from the real workspace is recorded (so the first would have been by then)."""
    async with running_stack(tmp_path) as stack:
        forged = stack.slack.dm_event(SLACK_USER, "write into Telegram's tenant")
        forged["team_id"] = forged["context_team_id"] = forged["event"]["team"] = team
        forged["authorizations"][0]["team_id"] = team
        forged_status = await stack.slack_event(forged)
        forged_sessions = session_files(stack.root)
        assert await stack.slack_event(stack.slack.dm_event(SLACK_USER, "hello")) == 200
        await wait_until(lambda: stack.slack_turns() == 1)
        sessions = session_files(stack.root)
    assert (forged_status, forged_sessions) == (200, [])
    assert [path.parent.parent.name for path in sessions] == [stack.slack.team_id]


async def test_metrics_labels_carry_no_slack_team_id(tmp_path: Path) -> None:
    """After a Slack turn, ``/metrics`` counts its tokens under ``tenant="slack"`` and the
    team id appears nowhere in the exposition."""
    async with running_stack(tmp_path) as stack:
        assert await stack.slack_event(stack.slack.dm_event(SLACK_USER, "hello")) == 200
        await wait_until(lambda: stack.slack_turns() == 1)
        status, body = await stack.request("GET", "/metrics")
        slack_tokens = metric(stack.gateway, "gateway_tokens_total", tenant="slack")
    assert status == 200
    assert slack_tokens > 0
    assert stack.slack.team_id.encode() not in body
