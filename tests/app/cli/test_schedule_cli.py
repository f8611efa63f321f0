"""``gateway schedule``: the operator adds, lists, shows and cancels schedules in the store
``gateway run`` reads (here the data directory's file)."""

from __future__ import annotations

import asyncio
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import orjson
import pytest

from app.cli import main as cli_main


def cli(data_dir: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli_main(["schedule", "--data-dir", str(data_dir), *args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def _zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TIMEZONE", "Europe/Berlin")
    monkeypatch.delenv("GATEWAY_STORE_URL", raising=False)


def test_add_list_show_cancel(tmp_path: Path) -> None:
    """An operator's schedule in a group and one to a person: listed with their times in
    words, shown as JSON, cancelled once."""
    code, out, _ = cli(tmp_path, "add", "--tenant", "T0123", "--chat", "slack:C0123",
                       "--cron", "0 9 * * 1-5", "--say", "post the stand-up reminder")
    assert code == 0
    ident = out.split()[1].rstrip(":")
    assert "at 09:00 on Monday through Friday (Europe/Berlin, cron 0 9 * * 1-5)" in out
    code, out, _ = cli(tmp_path, "add", "--to", "telegram:1001", "--when", "in 2h",
                       "--say", "ask Ada about the invoice")
    assert code == 0
    assert "to telegram:@1001" in out
    code, out, _ = cli(tmp_path, "list")
    assert code == 0
    assert out.count("  active  ") == 2
    assert "slack:C0123  owner tenant  by operator" in out
    code, out, _ = cli(tmp_path, "--tenant", "T0123", "show", ident)  # before the action too
    shown = orjson.loads(out)
    assert (shown["trigger"], shown["spec"], shown["created_by"]) == ("cron", "0 9 * * 1-5",
                                                                      "operator")
    assert cli(tmp_path, "cancel", "--tenant", "T0123", ident)[:2] == (
        0, f"cancelled {ident}: post the stand-up reminder\n")
    code, _, err = cli(tmp_path, "cancel", "--tenant", "T0123", ident)
    assert (code, err) == (2, f"gateway schedule: no active schedule {ident!r} in tenant "
                              "T0123\n")
    code, out, _ = cli(tmp_path, "list", "--all", "--json")
    assert sorted(orjson.loads(line)["state"] for line in out.splitlines()) == \
        ["active", "cancelled"]


@pytest.mark.parametrize(("args", "message"), [
    (["--when", "teatime"], "is not a time of day"),
    (["--cron", "0 9 * *"], "a cron expression has five fields"),
    (["--when", "2020-01-01 09:00"], "has passed already"),
    (["--when", "in 1h", "--zone", "Mars/Base"], "is not a time zone name"),
])
def test_bad_triggers_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    """A trigger that cannot be read is refused in one line, and nothing is stored."""
    code, _, err = cli(tmp_path, "add", "--tenant", "T1", "--chat", "slack:C1", "--say", "x",
                       *args)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1
    assert cli(tmp_path, "list")[1] == "(no schedules)\n"


@pytest.mark.parametrize("tenant", [[], ["--tenant", "default"], ["--tenant", "web"]])
def test_a_slack_schedule_names_its_workspace(tmp_path: Path, tenant: list[str]) -> None:
    """A Slack workspace is its own tenant: a Slack schedule filed under another tenant (the
    default one when --tenant is left out) is refused in one line, and nothing is stored."""
    code, _, err = cli(tmp_path, "add", *tenant, "--to", "slack:U0123", "--when", "in 1h",
                       "--say", "x")
    assert code == 2
    assert "a Slack schedule belongs to its workspace: the tenant is its team id" in err
    assert err.count("\n") == 1
    assert cli(tmp_path, "list")[1] == "(no schedules)\n"


async def test_list_says_until_when_and_why_a_delivery_is_held(tmp_path: Path) -> None:
    """A claimed occurrence held back (the tenant's proactive rate limit) is listed with the
    time it waits for, in the schedule's zone, and the reason."""
    from sessions.schedule_file import FileScheduleStore
    from sessions.schedules import ScheduleRecord, Target

    at = 1_790_000_000.0 + 86_400 * 365  # a year after the tests' usual instant: still ahead
    await FileScheduleStore(tmp_path / "state").put(ScheduleRecord(
        id="sheld", tenant="default", owner="tenant", target=Target("telegram", "-100", "group"),
        trigger="at", spec=repr(at), zone="Europe/Berlin", instruction="say hello",
        created_by="operator", created_at=at - 60, firing=at, held_until=at + 60, held=1,
        held_reason="the tenant's proactive rate limit (2 per minute)"))
    code, out, _ = await asyncio.to_thread(cli, tmp_path, "list")
    assert code == 0
    assert "    held until Tuesday 21 September 2027 at 16:14 (Europe/Berlin): the tenant's " \
           "proactive rate limit (2 per minute)\n" in out
