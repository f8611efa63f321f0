"""Kill instants as protocol steps: the schedule of a crash-kill run, and the switch that kills.

A trial ends at a *step of the protocol*, never at a wall-clock time, so a schedule replays:
the gateway dies at the same step of the same kind of reply, whatever the machine's speed.
A step is seen where it happens: a fake platform's reply method, ``before`` it is applied
(the platform never took the call) or ``after`` (it took it; the gateway never hears back),
a call reaching the fake model, or what a web client receives. The switch
(:class:`KillSwitch`) sends the signal from right there, with no await in between.

One trial is written ``<telegram>/<slack>/<kill>/<pace>/<seed>``:

* ``telegram``: ``polling`` or ``webhook``; ``slack``: ``http`` or ``socket``;
* ``kill``: ``event:<n>:<before|after>`` (the n-th reply event of the trial, counting every
  Telegram ``sendMessage``/``editMessageText``, Slack ``chat.postMessage``/``chat.update``,
  model call and web answer), ``step:<channel>:<step>`` (the first time a reply on that
  channel reaches :data:`STEPS` ``step``), or ``stop:<n>`` (a SIGTERM at the n-th event);
* ``pace``: ``slow`` (answers stream for over a second, so previews go out mid-stream) or
  ``fast``; ``seed``: the trial's traffic.

A run's schedule is its trials joined by ``;``; it is printed, and
``GATEWAY_TRIAL_SCHEDULE=<schedule>`` runs exactly that schedule again.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fakes.hold import Dropped
from tests.reliability.crash_harness import (
    END,
    TOKEN,
    GatewayProcess,
    Progress,
    items_of_tokens,
    paid_items,
)
from tests.reliability.web_client import WebMessage

STEPS = ("before-send", "after-send", "mid-stream", "after-final", "after-note")
"""The steps of one reply: before its first message reaches the platform; after the
platform took it, before the gateway noted where it went; while the answer streams into it;
after the final text went in, before the item was marked answered; after that note."""
CHANNELS = ("telegram", "slack", "web")
REPLY_METHODS = {"sendmessage": "telegram", "editmessagetext": "telegram",
                 "chat.postMessage": "slack", "chat.update": "slack"}
"""The fakes' reply methods the switch counts (their hold keys)."""


@dataclass(frozen=True)
class TrialPlan:
    """One trial of a schedule (see the module docstring)."""

    telegram: str
    slack: str
    kill: str
    slow: bool
    seed: int

    def encode(self) -> str:
        return "/".join((self.telegram, self.slack, self.kill, "slow" if self.slow else "fast",
                         str(self.seed)))

    @classmethod
    def decode(cls, text: str) -> TrialPlan:
        telegram, slack, kill, pace, seed = text.strip().split("/")
        if telegram not in ("polling", "webhook") or slack not in ("http", "socket"):
            raise ValueError(f"bad trial {text!r}: telegram polling|webhook, slack http|socket")
        kind, *args = kill.split(":")
        if not ((kind == "event" and len(args) == 2 and args[1] in ("before", "after"))
                or (kind == "step" and len(args) == 2 and args[0] in CHANNELS
                    and args[1] in STEPS)
                or (kind == "stop" and len(args) == 1)):
            raise ValueError(f"bad kill {kill!r} in {text!r}")
        return cls(telegram, slack, kill, pace == "slow", int(seed))

    @property
    def label(self) -> str:
        """The kill, for tables: ``after-final on slack``, ``event 7 (after)``, ``SIGTERM at
        event 4``."""
        kind, *args = self.kill.split(":")
        if kind == "step":
            return f"{args[1]} on {args[0]}"
        if kind == "stop":
            return f"SIGTERM at event {args[0]}"
        return f"event {args[0]} ({args[1]})"


def encode(plans: list[TrialPlan]) -> str:
    return ";".join(plan.encode() for plan in plans)


def decode(schedule: str) -> list[TrialPlan]:
    return [TrialPlan.decode(part) for part in schedule.split(";") if part.strip()]


def random_plans(rng: random.Random, trials: int, events: int, *,
                 stops: int = 0) -> list[TrialPlan]:
    """``trials`` kills at reply events drawn uniformly from 1..``events`` (the events of a
    burst), each before or after its call as drawn; inputs alternate so every one runs;
    ``stops`` of them (spread out) are a SIGTERM instead."""
    stop_at = {round((i + 0.5) * trials / stops) for i in range(stops)} if stops else set()
    plans = []
    for number in range(trials):
        n = rng.randint(1, events)
        kill = f"stop:{n}" if number in stop_at else f"event:{n}:{rng.choice(('before', 'after'))}"
        plans.append(TrialPlan("polling" if number % 2 else "webhook",
                               "socket" if number % 4 >= 2 else "http", kill,
                               rng.random() < 0.5, rng.getrandbits(32)))
    return plans


def step_plans(rng: random.Random, *, full: bool = False) -> list[TrialPlan]:
    """Every step of a reply on every channel, 5 x 3 trials, the inputs taking turns
    (Telegram polling and webhook, Slack HTTP and Socket Mode) so each runs at several steps;
    ``full``: every step on every input, 5 x 5 trials."""
    plans = []
    if full:
        targets = [("telegram", "polling", "http"), ("telegram", "webhook", "socket"),
                   ("slack", "webhook", "http"), ("slack", "polling", "socket"),
                   ("web", "polling", "http")]
        for channel, telegram, slack in targets:
            plans += [TrialPlan(telegram, slack, f"step:{channel}:{step}",
                                step == "mid-stream", rng.getrandbits(32)) for step in STEPS]
        return plans
    for number, step in enumerate(STEPS):
        for turn, channel in enumerate(CHANNELS):
            telegram = "polling" if (number + turn) % 2 else "webhook"
            slack = "socket" if (number + turn) % 2 == 0 else "http"
            plans.append(TrialPlan(telegram, slack, f"step:{channel}:{step}",
                                   step == "mid-stream", rng.getrandbits(32)))
    return plans


Event = tuple[str, str, str, str]
"""``(channel, what, phase, text)``: what happened, as the switch sees it."""


class KillSwitch:
    """Kills the gateway at its plan's step (see the module docstring).

    ``fired`` says where it fired (None until then); ``done`` is set then. Wire it with
    :meth:`platform` (the fakes' taps), :meth:`model_call` and :meth:`web`; ``channel_of``
    names the channel of a message token."""

    def __init__(self, plan: TrialPlan, gateway: GatewayProcess, data_dir: Path,
                 channel_of: Callable[[str], str]) -> None:
        self.plan = plan
        self.gateway = gateway
        self.data_dir = data_dir
        self.channel_of = channel_of
        kind, *args = plan.kill.split(":")
        self.kind = kind
        self.target = int(args[0]) if kind in ("event", "stop") else 0
        self.phase = args[1] if kind == "event" else "before"
        self.channel = args[0] if kind == "step" else ""
        self.step = args[1] if kind == "step" else ""
        self.count = 0
        self.seen = 0
        """Every reply event since :meth:`arm`, whatever the plan (the trial's progress)."""
        self.fired: str | None = None
        self.done = asyncio.Event()
        self.armed = False
        self._after: str | None = None  # fire at the next after-tap (the counted call's)
        self._noting: asyncio.Task[None] | None = None
        self.started = time.monotonic()

    def arm(self) -> None:
        """Count and fire from now on (the trial's traffic starts)."""
        self.armed = True
        self.started = time.monotonic()

    def fire(self, where: str) -> None:
        if self.fired is not None:
            return
        sig = signal.SIGTERM if self.kind == "stop" else signal.SIGKILL
        alive = self.gateway.signal_now(sig)
        self.fired = f"{where} ({time.monotonic() - self.started:.2f} s in)"
        if not alive:
            self.fired += ": the gateway was not running"
        self.done.set()

    # -- what happens -------------------------------------------------------------------------

    def platform(self, phase: str, method: str, params: Mapping[str, Any], _: Any) -> None:
        """A fake platform's tap: a reply method ``before`` or ``after`` it is applied.
        Raises :class:`Dropped` for a call killed before the platform took it."""
        channel = REPLY_METHODS.get(method)
        if channel is None or not self.armed or self.fired is not None:
            return
        self.seen += 1
        text = str(params.get("text") or "")
        if phase == "after" and self._after is not None:
            where, self._after = self._after, None
            self.fire(where)
            return
        if phase == "before" and self._counted(f"{method} {text[:24]!r}", after=True):
            raise Dropped(method)  # killed before the platform took it
        if self.kind == "step" and channel == self.channel:
            self._step(phase, method, text)

    def model_call(self, token: str) -> None:
        """A call reached the fake model (for ``token``'s message)."""
        if not self.armed or self.fired is not None:
            return
        self.seen += 1
        self._counted(f"model call for {token}", after=False)
        if (self.kind == "step" and self.channel == "web" and self.step == "before-send"
                and self.channel_of(token) == "web"):
            self.fire(f"before-send on web: the model call for {token}")

    def web(self, kind: str, message: WebMessage) -> None:
        """What a web client got: ``response``, ``delta`` or ``done``."""
        if not self.armed or self.fired is not None:
            return
        self.seen += 1
        if kind == "response":
            self._counted(f"web answer for {message.token}", after=False)
        if self.kind != "step" or self.channel != "web":
            return
        wanted = {"after-send": "response", "mid-stream": "delta", "after-final": "done",
                  "after-note": "done"}.get(self.step)
        if kind != wanted:
            return
        if self.step == "after-note":
            self._after_note(message.token, f"after-note on web ({message.token})")
        else:
            self.fire(f"{self.step} on web ({message.token}: {kind})")

    def _counted(self, what: str, *, after: bool) -> bool:
        """Count one reply event; at the plan's n-th, fire (now, or at the call's after-tap
        when ``after`` is possible and planned). True when it fired before a platform call
        that must then not be applied."""
        if self.kind not in ("event", "stop"):
            return False
        self.count += 1
        if self.count != self.target:
            return False
        where = f"event {self.count}: {what}"
        if after and self.kind == "event" and self.phase == "after":
            self._after = f"{where}, after"
            return False
        self.fire(f"{where}, before" if after else where)
        return after and self.kind == "event"

    def _step(self, phase: str, method: str, text: str) -> None:
        """A reply call on the target channel: is it the step?"""
        sends = method in ("sendmessage", "chat.postMessage")
        complete = END.search(text) is not None
        partial = not complete and TOKEN.search(text) is not None
        where = f"{self.step} on {self.channel}: {method} {text[:24]!r}"
        if self.step == "before-send":
            if phase == "before" and sends:
                self.fire(where)
                raise Dropped(method)
            return
        if phase != "after":
            return
        if ((self.step == "after-send" and sends) or (self.step == "mid-stream" and partial)
                or (self.step == "after-final" and complete)):
            self.fire(where)
        elif self.step == "after-note" and complete:
            match = END.search(text)
            assert match is not None
            self._after_note(match.group(1), f"after-note on {self.channel} ({match.group(1)})")

    def _after_note(self, token: str, where: str) -> None:
        """Fire once the journal notes ``token``'s item answered (a positive sign)."""
        if self._noting is None:
            self._noting = asyncio.get_running_loop().create_task(self._noted(token, where))

    async def _noted(self, token: str, where: str) -> None:
        """Fire once the journal notes ``token``'s answer (a positive sign), waiting as long
        as the gateway makes progress (a loaded machine notes late, not never); fire anyway,
        saying so, once it stalled."""
        proc = self.gateway.proc
        progress = Progress(proc.pid if proc is not None else -1, self.gateway.log)
        while self.fired is None and not progress.stalled():
            items = items_of_tokens(self.data_dir).get(token, set())
            if items & paid_items(self.data_dir):
                self.fire(where)
                return
            await asyncio.sleep(0.01)
        self.fire(f"{where}: not noted before the gateway stalled ({progress.seconds:.0f} s)")

    async def aclose(self) -> None:
        if self._noting is not None:
            self._noting.cancel()
            await asyncio.wait([self._noting])


class StepCounter:
    """Counts a trial's reply events as :class:`KillSwitch` does (every Telegram and Slack send
    and edit, model call and web answer) and runs ``action`` at the ``n``-th, right there (no
    await in between): the disk-fault trials fill the disk, or stop the gateway, at a step.

    Wire it like a switch (:meth:`platform`, :meth:`model_call`, :meth:`web`); :meth:`at`
    sets the next action, counted from the call; ``done`` is set when it ran."""

    def __init__(self) -> None:
        self.count = 0
        self._target: int | None = None
        self._action: Callable[[], None] | None = None
        self.what: str | None = None
        self.done = asyncio.Event()

    def at(self, n: int, action: Callable[[], None]) -> None:
        self.count = 0
        self._target = n
        self._action = action
        self.what = None
        self.done = asyncio.Event()

    def run_now(self, what: str) -> None:
        """Run the action now (its step never came: the end of the traffic)."""
        action, self._action = self._action, None
        if action is not None:
            self.what = what
            action()
            self.done.set()

    def _event(self, what: str) -> None:
        if self._action is None:
            return
        self.count += 1
        if self.count == self._target:
            self.run_now(f"event {self.count}: {what}")

    def platform(self, phase: str, method: str, params: Mapping[str, Any], _: Any) -> None:
        if phase == "before" and method in REPLY_METHODS:
            self._event(f"{method} {str(params.get('text') or '')[:24]!r}")

    def model_call(self, token: str) -> None:
        self._event(f"model call for {token}")

    def web(self, kind: str, message: WebMessage) -> None:
        if kind == "response":
            self._event(f"web answer for {message.token}")
