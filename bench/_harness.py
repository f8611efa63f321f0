"""Shared plumbing of the channel-path benchmarks (``bench_telegram.py``, ``bench_slack.py``).

Each run starts one subject (the gateway or its bare echo-bot floor) in a fresh subprocess.
That way its CPU time (user + system, all threads; see :meth:`Child.cpu_seconds`) covers only
that subject, and its peak RSS (``VmHWM``) is its own. The driver and the fake platform server
run in this process, and the driver measures latency on this process's clock: from just before
a message is handed to the platform until the fake records the bot's reply. Rounds alternate
the order of subject and floor, so drift in the load of the shared machine hits both sides.

Only the standard library is imported at module level. The subjects' children import this
module too, and it must not add anything to their RSS.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READY = "READY "
"""A child prints this, then a JSON object (e.g. its port), once it takes traffic."""


# -- children ---------------------------------------------------------------------------------

class Child:
    """One subject process: ``python <script> --serve <kind> --config <json>``.

    Use as an async context manager. It waits for the READY line and is stopped with SIGTERM
    (killed if it does not exit in time). Its stderr goes to ``log_path``.
    """

    def __init__(self, script: Path, kind: str, config: dict[str, Any], log_path: Path) -> None:
        self.args = [sys.executable, str(script), "--serve", kind, "--config", json.dumps(config)]
        self.log_path = log_path
        self.info: dict[str, Any] = {}
        self._proc: asyncio.subprocess.Process | None = None
        self._ps: Any = None

    async def __aenter__(self) -> Child:
        import psutil  # only the parent needs it

        with self.log_path.open("wb") as log:
            self._proc = await asyncio.create_subprocess_exec(
                *self.args, stdout=subprocess.PIPE, stderr=log, cwd=str(ROOT))
        assert self._proc.stdout is not None
        try:
            async with asyncio.timeout(60):
                while True:
                    line = (await self._proc.stdout.readline()).decode()
                    if not line:
                        raise RuntimeError(f"{self.args[3]} exited before READY; see "
                                           f"{self.log_path}:\n{self.log_path.read_text()[-3000:]}")
                    if line.startswith(READY):
                        self.info = json.loads(line[len(READY):])
                        break
        except BaseException:
            await self._stop()
            raise
        self._ps = psutil.Process(self._proc.pid)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stop()

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def cpu_seconds(self) -> float:
        """CPU time of all the child's threads (user + system), in nanosecond resolution.

        Summed from ``/proc/<pid>/task/*/schedstat``: psutil's ``cpu_times`` counts 10 ms
        clock ticks, too coarse for 30 messages of a few ms each. (A thread that ends between
        two readings would drop out; asyncio's executor threads live as long as the loop.)
        """
        total = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue
        return total / 1e9

    def cpu_seconds_psutil(self) -> float:
        """psutil's user + system CPU time (10 ms ticks), to cross-check :meth:`cpu_seconds`."""
        times = self._ps.cpu_times()
        return float(times.user + times.system)

    def peak_rss(self) -> int:
        """``VmHWM``: the largest resident set since the process started, in bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/<pid>/status (Linux only)")

    def signal(self, sig: int) -> None:
        assert self._proc is not None
        self._proc.send_signal(sig)

    async def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(20):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


def serve_forever(main: Callable[[asyncio.Event, Callable[[dict[str, Any]], None]],
                                 Awaitable[None]], profile: str | None = None) -> None:
    """The child side: run ``main(stop, ready)`` until SIGTERM.

    ``ready(info)`` prints the READY line. With ``profile`` set, cProfile records from SIGUSR1
    until SIGTERM and the stats are dumped to that path (so start-up is left out). Its clock
    is the event-loop thread's CPU time, not wall time: on a busy machine a wall clock
    charges time spent descheduled to whatever function happened to be running.
    """
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)

    async def runner() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_term() -> None:
            if profiler is not None:
                profiler.disable()
            stop.set()

        loop.add_signal_handler(signal.SIGTERM, on_term)
        if profiler is not None:
            loop.add_signal_handler(signal.SIGUSR1, profiler.enable)

        def ready(info: dict[str, Any]) -> None:
            sys.stdout.write(READY + json.dumps(info) + "\n")
            sys.stdout.flush()

        await main(stop, ready)

    asyncio.run(runner())
    if profiler is not None and profile:
        profiler.dump_stats(profile)


ROOT = Path(__file__).resolve().parents[1]


# -- measurement ------------------------------------------------------------------------------

@dataclass(slots=True)
class Run:
    """One scenario run of one subject."""

    subject: str
    scenario: str
    messages: int
    wall: float
    latencies: list[float]
    cpu: float
    """Subject process CPU seconds during the run (user + system, all threads)."""
    driver_cpu: float
    """This process's CPU seconds during the run (driver and fake server)."""
    peak_rss: int
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.messages / self.wall

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99)

    @property
    def cpu_ms(self) -> float:
        return self.cpu / self.messages * 1000

    @property
    def driver_cpu_ms(self) -> float:
        return self.driver_cpu / self.messages * 1000


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


SendOne = Callable[[int, int], Awaitable[float]]
"""``send(chat, i)``: push message ``i`` of ``chat`` and return its latency once answered."""


async def closed_loop(child: Child, subject: str, scenario: str, send: SendOne,
                      chats: Sequence[int], per_chat: int) -> Run:
    """Every chat sends its next message once the previous one is answered; all chats at once.

    Callers bound it with ``asyncio.timeout``."""
    latencies: list[float] = []

    async def one_chat(chat: int) -> None:
        for i in range(per_chat):
            latencies.append(await send(chat, i))

    cpu0, ps0, own0 = child.cpu_seconds(), child.cpu_seconds_psutil(), time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(one_chat(c) for c in chats))
    wall = time.perf_counter() - started
    cpu1, ps1, own1 = child.cpu_seconds(), child.cpu_seconds_psutil(), time.process_time()
    return Run(subject, scenario, len(chats) * per_chat, wall, latencies, cpu1 - cpu0,
               own1 - own0, child.peak_rss(), {"cpu_psutil": ps1 - ps0})


# -- rounds and report ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    title: str
    chats: int
    per_chat: int


@dataclass(frozen=True, slots=True)
class Targets:
    rate_ratio: float = 0.30
    """Closed loop: subject messages/s >= this x the floor's."""
    p50_ratio: float = 5.0
    """Single chat: subject p50 latency <= this x the floor's."""
    cpu_ms: float = 5.0
    """Subject CPU ms per message."""
    cpu_over_floor_ms: float | None = None
    """When set, the CPU target is the floor's CPU per message plus this many ms instead."""
    rss_ratio: float = 2.0
    """Subject peak RSS <= this x the floor's."""


RunOne = Callable[[str, Scenario, int], Awaitable[Run]]


async def alternate(rounds: int, scenarios: Sequence[Scenario], subjects: Sequence[str],
                    run_one: RunOne, log: Callable[[str], None] = print) -> list[Run]:
    """``rounds`` x every scenario x every subject; the order is reversed every round."""
    runs: list[Run] = []
    for r in range(rounds):
        for scenario in scenarios:
            order = list(subjects) if r % 2 == 0 else list(reversed(subjects))
            for subject in order:
                run = await run_one(subject, scenario, r)
                runs.append(run)
                log(f"round {r + 1}/{rounds} {scenario.name} {subject:18s} "
                    f"{run.rate:7.1f} msg/s  p50 {run.p50 * 1e3:6.1f} ms  "
                    f"p99 {run.p99 * 1e3:6.1f} ms  cpu {run.cpu_ms:5.2f} ms/msg  "
                    f"rss {run.peak_rss / 2**20:5.1f} MiB  driver {run.driver_cpu_ms:4.2f} ms/msg")
    return runs


def _paired(runs: Sequence[Run], scenario: str, subject: str, floor: str,
            metric: Callable[[Run], float]) -> list[float]:
    """Per-round ratios subject / floor (runs come in round order, one of each per round)."""
    mine = [metric(r) for r in runs if r.scenario == scenario and r.subject == subject]
    base = [metric(r) for r in runs if r.scenario == scenario and r.subject == floor]
    return [a / b for a, b in zip(mine, base, strict=True)]


def _median(runs: Sequence[Run], scenario: str, subject: str,
            metric: Callable[[Run], float]) -> float:
    return statistics.median(metric(r) for r in runs
                             if r.scenario == scenario and r.subject == subject)


def _extra(key: str) -> Callable[[Run], float]:
    return lambda run: run.extra[key]


def _range(values: Sequence[float]) -> str:
    return f"{min(values):.2f}\N{EN DASH}{max(values):.2f}"


def verdict(ok: bool, miss: str) -> str:
    return "**pass**" if ok else f"**miss** ({miss})"


def report_tables(runs: Sequence[Run], scenarios: Sequence[Scenario], subject: str,
                  floor: str, targets: Targets,
                  extra_rows: Sequence[tuple[str, str, float]] = (),
                  context: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """Markdown tables per scenario, and the headline figures for the summary.

    ``extra_rows``: (label, key in ``Run.extra``, scale) rows shown without a target.
    ``context``: another subject measured in the same rounds (a second floor), shown beside
    the floor with the subject's ratio to it, without targets."""
    lines: list[str] = []
    summary: dict[str, Any] = {}
    for sc in scenarios:
        def med(metric: Callable[[Run], float], who: str, name: str = sc.name) -> float:
            return _median(runs, name, who, metric)

        def pair(metric: Callable[[Run], float], against: str = floor,
                 name: str = sc.name) -> list[float]:
            return _paired(runs, name, subject, against, metric)

        def beside(metric: Callable[[Run], float], scale: float = 1.0, fmt: str = ".1f") -> str:
            """The context's median and the subject's ratio to it (cells), if any."""
            if context is None:
                return ""
            ratios = pair(metric, context)
            return (f"{format(med(metric, context) * scale, fmt)} | "
                    f"{statistics.median(ratios):.2f}x ({_range(ratios)}) | ")

        rate_r = pair(lambda r: r.rate)
        p50_r = pair(lambda r: r.p50)
        p99_r = pair(lambda r: r.p99)
        rss_r = pair(lambda r: r.peak_rss)
        cpu_r = pair(lambda r: r.cpu_ms)
        s_cpu = med(lambda r: r.cpu_ms, subject)
        f_cpu = med(lambda r: r.cpu_ms, floor)
        head = (f"{context} (context) | ratio {subject}/{context} | " if context else "")
        lines += [
            f"### ({sc.name}) {sc.title}", "",
            f"| measure | {head}{floor} (floor) | {subject} | ratio {subject}/{floor} "
            "(median of rounds; range) | target | result |",
            "|---|---|---|---|---|---|" + ("---|---|" if context else ""),
        ]
        rate_ok = statistics.median(rate_r) >= targets.rate_ratio
        target_rate = f">= {targets.rate_ratio:.2f}x" if sc.chats > 1 else ""
        res_rate = (verdict(rate_ok, f"{statistics.median(rate_r):.2f}x, "
                            f"{(targets.rate_ratio - statistics.median(rate_r)) * 100:.0f} "
                            "points short") if sc.chats > 1 else "")
        lines.append(f"| messages/s | {beside(lambda r: r.rate)}{med(lambda r: r.rate, floor):.1f}"
                     f" | {med(lambda r: r.rate, subject):.1f} | {statistics.median(rate_r):.2f}x "
                     f"({_range(rate_r)}) | {target_rate} | {res_rate} |")
        p50_ok = statistics.median(p50_r) <= targets.p50_ratio
        target_p50 = f"<= {targets.p50_ratio:g}x" if sc.chats == 1 else ""
        res_p50 = (verdict(p50_ok, f"{statistics.median(p50_r):.2f}x, "
                           f"{statistics.median(p50_r) / targets.p50_ratio:.2f}x the limit")
                   if sc.chats == 1 else "")
        lines.append(f"| p50 latency (ms) | {beside(lambda r: r.p50, 1e3)}"
                     f"{med(lambda r: r.p50, floor) * 1e3:.1f} | "
                     f"{med(lambda r: r.p50, subject) * 1e3:.1f} | "
                     f"{statistics.median(p50_r):.2f}x ({_range(p50_r)}) | {target_p50} | "
                     f"{res_p50} |")
        lines.append(f"| p99 latency (ms) | {beside(lambda r: r.p99, 1e3)}"
                     f"{med(lambda r: r.p99, floor) * 1e3:.1f} | "
                     f"{med(lambda r: r.p99, subject) * 1e3:.1f} | "
                     f"{statistics.median(p99_r):.2f}x ({_range(p99_r)}) | | |")
        for label, key, scale in extra_rows:
            ratios = pair(_extra(key))
            lines.append(f"| {label} | {beside(_extra(key), scale)}"
                         f"{med(_extra(key), floor) * scale:.1f} | "
                         f"{med(_extra(key), subject) * scale:.1f} | "
                         f"{statistics.median(ratios):.2f}x ({_range(ratios)}) | | |")
        if targets.cpu_over_floor_ms is not None:
            cpu_limit = f_cpu + targets.cpu_over_floor_ms
            target_cpu = f"<= floor + {targets.cpu_over_floor_ms:g} ms ({cpu_limit:.2f})"
        else:
            cpu_limit = targets.cpu_ms
            target_cpu = f"<= {targets.cpu_ms:.0f} ms"
        cpu_ok = s_cpu <= cpu_limit
        lines.append(f"| CPU ms per message (subject process) | "
                     f"{beside(lambda r: r.cpu_ms, 1.0, '.2f')}{f_cpu:.2f} | {s_cpu:.2f} | "
                     f"{statistics.median(cpu_r):.2f}x ({_range(cpu_r)}) | {target_cpu} | "
                     f"{verdict(cpu_ok, f'{s_cpu - cpu_limit:.2f} ms over')} |")
        rss_ok = statistics.median(rss_r) <= targets.rss_ratio
        lines.append(f"| peak RSS (MiB) | {beside(lambda r: r.peak_rss, 2**-20)}"
                     f"{med(lambda r: r.peak_rss, floor) / 2**20:.1f} | "
                     f"{med(lambda r: r.peak_rss, subject) / 2**20:.1f} | "
                     f"{statistics.median(rss_r):.2f}x ({_range(rss_r)}) | "
                     f"<= {targets.rss_ratio:.0f}x | "
                     f"{verdict(rss_ok, f'{statistics.median(rss_r):.2f}x')} |")
        driver = (f"{med(lambda r: r.driver_cpu_ms, context):.2f} | | " if context else "")
        lines.append(f"| driver + fake CPU ms per message (this process) | {driver}"
                     f"{med(lambda r: r.driver_cpu_ms, floor):.2f} | "
                     f"{med(lambda r: r.driver_cpu_ms, subject):.2f} | | | |")
        lines.append("")
        summary[sc.name] = {
            "rate_ratio": statistics.median(rate_r), "p50_ratio": statistics.median(p50_r),
            "cpu_ms": s_cpu, "cpu_floor_ms": f_cpu, "rss_ratio": statistics.median(rss_r),
        }
    return lines, summary


def variant_table(runs: Sequence[Run], scenarios: Sequence[Scenario], base: str,
                  variants: Sequence[tuple[str, str]]) -> list[str]:
    """Diagnostic rows: each variant of ``base`` against ``base``, paired in the same rounds.

    ``variants``: (subject name, description). Both scenarios of the main run are used:
    CPU and calls per message from the closed loop (a), p50 from the single chat (b)."""
    closed, single = scenarios[0].name, scenarios[1].name
    lines = [f"| variant | calls/msg | CPU ms/msg ({closed}) | msg/s ({closed}) | "
             f"p50 ms ({single}) | CPU ms/msg ({single}) |",
             "|---|---|---|---|---|---|"]

    def cell(name: str, metric: Callable[[Run], float], subject: str, fmt: str) -> str:
        value = _median(runs, name, subject, metric)
        if subject == base:
            return format(value, fmt)
        ratio = statistics.median(_paired(runs, name, subject, base, metric))
        return f"{format(value, fmt)} ({ratio:.2f}x)"

    for subject, description in [(base, f"{base} as shipped"), *variants]:
        lines.append(
            f"| {description} | {cell(closed, _extra('calls_per_message'), subject, '.2f')} | "
            f"{cell(closed, lambda r: r.cpu_ms, subject, '.2f')} | "
            f"{cell(closed, lambda r: r.rate, subject, '.1f')} | "
            f"{cell(single, lambda r: r.p50 * 1e3, subject, '.1f')} | "
            f"{cell(single, lambda r: r.cpu_ms, subject, '.2f')} |")
    return lines


def cpu_check_line(runs: Sequence[Run]) -> str:
    """How far psutil's tick-based CPU times are from the schedstat ones used in the tables."""
    diffs = [abs(r.extra["cpu_psutil"] - r.cpu) * 1e3 for r in runs]
    return (f"CPU times are the subject's schedstat runtime (ns resolution, all threads); "
            f"psutil's 10 ms-tick user + system times differ from them by a median "
            f"{statistics.median(diffs):.0f} ms (max {max(diffs):.0f} ms) per run.")


def machine_line(before: tuple[float, float, float] | None = None) -> str:
    """The machine and its load average (1/5/15 min) at the end of the run, and at its start
    when ``before`` is given: other work on a shared machine shows there."""
    load = os.getloadavg()
    start = (f"{before[0]:.1f} / {before[1]:.1f} / {before[2]:.1f} at the start, "
             if before is not None else "")
    return (f"Machine: {os.cpu_count()} vCPU, Python {sys.version.split()[0]}, load average "
            f"(1/5/15 min) {start}{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end of "
            "the run; a shared VM with other work running.")


def check_provider_calls(subject: str, server: Any, replies: int) -> None:
    """A subject talking to the fake provider (a gateway, or the ``echo/llm`` floor) made
    exactly one call per reply."""
    if subject.endswith("/scripted") or not (subject.startswith("gateway")
                                             or subject == "echo/llm"):
        return
    if len(server.requests) != replies:
        raise RuntimeError(f"{subject}: {len(server.requests)} provider calls for {replies} "
                           "replies")


def serve_child(gateway: Callable[..., Awaitable[None]],
                echo: Callable[..., Awaitable[None]]) -> None:
    """A platform benchmark's child (``--serve KIND[/VARIANT] --config JSON``): serve the
    gateway or the echo floor with the config, the variant added to it, until SIGTERM."""
    kind, _, variant = sys.argv[sys.argv.index("--serve") + 1].partition("/")
    cfg = {**json.loads(sys.argv[sys.argv.index("--config") + 1]), "variant": variant}
    serve = gateway if kind == "gateway" else echo
    serve_forever(lambda stop, ready: serve(cfg, stop, ready), profile=cfg.get("profile"))


def write_report(name: str, text: str) -> Path:
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    path = out / name
    path.write_text(text)
    return path


def profile_shares(stats_path: str, groups: Sequence[tuple[str, str, str]]) -> list[str]:
    """Markdown rows: each group's cumulative share of the profiled CPU time.

    ``groups``: (label, path suffix, function name); groups may nest, so shares need not
    add up to 100 %."""
    import pstats

    stats = pstats.Stats(stats_path)
    total = stats.total_tt  # type: ignore[attr-defined]  # set by Stats, not in typeshed
    rows = ["| part of the path (cumulative; groups may nest) | share of CPU |", "|---|---|"]
    for label, suffix, function in groups:
        best = max((entry[3] for (path, _, name), entry in
                    stats.stats.items()  # type: ignore[attr-defined]  # as above
                    if path.endswith(suffix) and name == function), default=0.0)
        rows.append(f"| {label} | {best / total * 100:.0f} % |")
    return rows


def top_functions(stats_path: str, limit: int = 25) -> str:
    """The cProfile hot spots by internal time and by cumulative time, as text."""
    import io
    import pstats

    buf = io.StringIO()
    stats = pstats.Stats(stats_path, stream=buf)
    stats.strip_dirs().sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)
    return buf.getvalue()
