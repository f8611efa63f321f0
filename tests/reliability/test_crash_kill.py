"""Crash-kill trials: `gateway run` killed at protocol steps and restarted on its data dir.

Each trial starts the gateway (a subprocess: Telegram by long polling or by webhook, Slack
Events over HTTP or Socket Mode, and the web chat's ``/api/chat``, against the fakes in this
process; the fake Anthropic API answers after a short random delay, in slow trials streaming
for over a second so previews go out), lets the platforms deliver again what they were not
acknowledged, sends a burst of mixed messages and kills the gateway at a step of the
protocol (:mod:`tests.reliability.crash_schedule`): from inside the fake that sees it, so
the kill lands exactly there whatever the machine's speed.

* :func:`test_kills_at_random_steps`: each kill at a reply event drawn uniformly over the
  whole burst (every Telegram and Slack send and edit, model call and web answer counts),
  before or after its call; two of them a SIGTERM instead (a clean stop under traffic).
* :func:`test_kills_at_every_step_of_a_reply`: each step of a reply (before its first message
  reaches the platform; after the platform took it, before the gateway noted where; while
  the answer streams into it; after the final text went in; after the item was marked
  answered) on each channel, the inputs taking turns (Telegram polling and webhook, Slack
  HTTP and Socket Mode; 15 trials); ``make trials`` runs each step on each input (25).

After every trial: no acknowledged message lost (in a session log, or owed in the journal),
none with a second complete answer on its platform or in the log, every log replayable.
After a last clean run: every acknowledged message has exactly one complete answer on its
platform (a web message: in its 200) and in the log. The stray messages a kill can leave
(a placeholder sent just before the kill, its id not yet noted; with Telegram no way to find
it again) are counted apart and reported, never counted as answers.

``GATEWAY_CRASH_TRIALS=N`` draws N random trials (20 by default, 60 in ``make trials``);
``GATEWAY_CRASH_SEED``
seeds the draw; the schedule is printed, and ``GATEWAY_TRIAL_SCHEDULE='<test>=<schedule>'``
(as printed) replays exactly it, in the test it names (the other one skips). A run that finds
anything keeps its data and logs under ``test-output/failed-trials/`` and says where. Reports:
``test-output/crash-random.txt`` and ``test-output/crash-steps.txt``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.reliability.crash_schedule import TrialPlan, decode, random_plans, step_plans
from tests.reliability.crash_trials import BURST, Summary, run_schedule
from tests.trials import FULL, sized

RANDOM_TRIALS = sized(20, 60)
"""Random-instant trials: 20 in ``make test``, 60 in ``make trials``."""
EVENTS = 3 * BURST
"""Reply events in a burst, about: a model call and one or two platform calls per message."""
TRIAL_SECONDS = 90
"""What one trial may take on a machine at load 10-24 (a cold start, a burst, a kill: 4 s
when quiet). With the final run's :data:`FINAL_SECONDS` it sizes each test's pytest timeout
to its trial count: a backstop only, since every wait inside is bounded by progress (the
gateway's and the traffic's), never by the whole."""
FINAL_SECONDS = 600


def budget(trials: int) -> int:
    """The pytest timeout, in seconds, of a run of ``trials`` trials and its final run."""
    return FINAL_SECONDS + TRIAL_SECONDS * trials


def replayed(name: str) -> int | None:
    """How many trials ``GATEWAY_TRIAL_SCHEDULE`` replays in test ``name`` (None: it names
    none there)."""
    named, _, schedule = os.environ.get("GATEWAY_TRIAL_SCHEDULE", "").strip().partition("=")
    return len(decode(schedule)) if named == name and schedule else None


RANDOM_COUNT = replayed("crash-random") or int(os.environ.get("GATEWAY_CRASH_TRIALS")
                                               or RANDOM_TRIALS)
STEP_COUNT = replayed("crash-steps") or len(step_plans(random.Random(0), full=FULL))


def planned(name: str, default: list[TrialPlan]) -> list[TrialPlan]:
    """The schedule to run: ``GATEWAY_TRIAL_SCHEDULE='<name>=<schedule>'`` when it names
    this test (one that names the other test skips this one), else ``default``."""
    given = os.environ.get("GATEWAY_TRIAL_SCHEDULE", "").strip()
    if not given:
        return default
    named, _, schedule = given.partition("=")
    if named != name:
        pytest.skip(f"GATEWAY_TRIAL_SCHEDULE replays {named!r}, not this test")
    return decode(schedule)


def checked(summary: Summary, capsys: pytest.CaptureFixture[str], planned_count: int) -> None:
    with capsys.disabled():
        print(f"\n{summary.report()}")
    problems = [f"trial {r.number} [{r.plan.encode()}]: {f}"
                for r in summary.results for f in r.findings] + summary.final
    context = (f"{summary.line()}\nreplay: GATEWAY_TRIAL_SCHEDULE='{summary.test}="
               f"{summary.schedule}'\n"
               f"kept: {summary.kept}\n" + "\n".join(problems[:40]))
    # What the summary claims, checked: every planned trial ran and ended at a kill, every
    # channel had messages acknowledged, every acknowledged message was recorded and has one
    # complete answer, and no trial found anything.
    assert len(summary.results) == planned_count, context
    assert all(r.fired != "?" for r in summary.results), context
    assert all(n > 0 for n in summary.by_channel.values()), context
    assert summary.total("acknowledged") == summary.total("once"), context
    assert summary.total("twice") == summary.total("never") == summary.total("lost") == 0, context
    assert summary.with_findings == [], context
    assert summary.final == [], context


@pytest.mark.timeout(budget(RANDOM_COUNT))
async def test_kills_at_random_steps(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Killed at reply events drawn uniformly over whole bursts (and twice stopped), under
    mixed load on every input, the gateway loses no acknowledged message and leaves exactly
    one complete answer for each; strays are counted apart."""
    trials = RANDOM_COUNT
    seed = int(os.environ.get("GATEWAY_CRASH_SEED") or random.randrange(2**32))
    plans = planned("crash-random", random_plans(random.Random(seed), trials, EVENTS,
                                           stops=2 if trials >= 10 else 0))
    summary = await run_schedule("crash-random", plans, tmp_path)
    checked(summary, capsys, len(plans))
    kills = {r.plan.kill.split(":")[0] for r in summary.results}
    assert {"event"} <= kills, summary.line()


@pytest.mark.timeout(budget(STEP_COUNT))
async def test_kills_at_every_step_of_a_reply(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Killed at each step of a reply on each input (Telegram polling and webhook, Slack HTTP
    and Socket Mode, web), the gateway loses nothing and never answers twice: an answer noted
    before it went out is finished by editing its message; only a placeholder whose id was
    not noted yet can stay behind."""
    rng = random.Random(int(os.environ.get("GATEWAY_CRASH_SEED") or random.randrange(2**32)))
    plans = planned("crash-steps", step_plans(rng, full=FULL))
    summary = await run_schedule("crash-steps", plans, tmp_path)
    checked(summary, capsys, len(plans))
    steps_run = {r.plan.kill for r in summary.results}
    assert len(steps_run) == len(plans), summary.line()
