"""Load the machine the way a busy CI host is: CPU-bound processes and an fsync-heavy writer.

    python3 bench/load_machine.py --seconds 900            # or: make load
    python3 bench/load_machine.py --cpu 8 --writers 1 --seconds 900 --dir /tmp

Eight processes spin on the CPU and one writes 64 KiB blocks, each followed by ``fsync``,
into a file it rewrites in a loop (under ``--dir``, by default the temporary directory, where
the tests keep their data). On the 2-core development machine that is a load average of about
10, what the suite's red runs saw. Run ``make test`` beside it (another terminal, or
``make load & make test``) to check that no verdict depends on the machine being quiet.

Bounded: every child stops by itself at the deadline (so a killed parent leaves nothing
running), and Ctrl-C or SIGTERM stops them all at once. Standard library only: it runs
before the project's virtualenv exists. At the end it prints what it did (fsyncs, megabytes
written, the load averages seen), so a report can say how the machine was loaded.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

BLOCK = 64 * 1024
FILE_BLOCKS = 256  # the writer's file is rewritten from the start every 16 MiB


def spin(deadline: float) -> None:
    """A CPU-bound child: arithmetic until the deadline."""
    x = 0
    while time.monotonic() < deadline:
        for i in range(100_000):
            x = (x * 31 + i) % 1_000_003


def write(deadline: float, directory: str, counts: mp.Queue[tuple[int, int]]) -> None:
    """An fsync-heavy child: 64 KiB, fsync, again, into one file until the deadline."""
    fd, name = tempfile.mkstemp(prefix="load-machine-", dir=directory)
    block = os.urandom(BLOCK)
    syncs = written = 0
    try:
        while time.monotonic() < deadline:
            if syncs % FILE_BLOCKS == 0:
                os.lseek(fd, 0, os.SEEK_SET)
            written += os.write(fd, block)
            os.fsync(fd)
            syncs += 1
    finally:
        os.close(fd)
        os.unlink(name)
        counts.put((syncs, written))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=900.0,
                        help="how long to load the machine (default 900)")
    parser.add_argument("--cpu", type=int, default=8, help="CPU-bound processes (default 8)")
    parser.add_argument("--writers", type=int, default=1,
                        help="fsync-heavy writers (default 1)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the writers write (default: the temporary directory)")
    args = parser.parse_args(argv)

    deadline = time.monotonic() + args.seconds
    counts: mp.Queue[tuple[int, int]] = mp.Queue()
    children = [mp.Process(target=spin, args=(deadline,), name=f"load-cpu-{n}", daemon=True)
                for n in range(args.cpu)]
    children += [mp.Process(target=write, args=(deadline, str(args.dir), counts),
                            name=f"load-disk-{n}", daemon=True) for n in range(args.writers)]

    def stop(signum: int, frame: FrameType | None) -> None:
        for child in children:
            if child.is_alive():
                child.terminate()
        raise SystemExit(128 + signum)

    started = time.strftime("%H:%M:%S")
    print(f"load_machine: {args.cpu} CPU-bound, {args.writers} fsync writer(s) in {args.dir}, "
          f"{args.seconds:.0f} s from {started}; load average {os.getloadavg()[0]:.1f}",
          flush=True)
    for child in children:
        child.start()
    # After the children start, so they keep the default handlers: a `pkill -f` reaches them
    # too, and a child cannot ask about its siblings.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    peaks: list[float] = []
    while time.monotonic() < deadline and any(c.is_alive() for c in children):
        time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
        peaks.append(os.getloadavg()[0])
    for child in children:
        child.join(timeout=30)
    syncs = written = 0
    while not counts.empty():
        s, w = counts.get()
        syncs += s
        written += w
    mean = sum(peaks) / len(peaks) if peaks else 0.0
    print(f"load_machine: done; {syncs} fsyncs, {written / 2**20:.0f} MiB written; "
          f"1-minute load average: mean {mean:.1f}, max {max(peaks, default=0.0):.1f}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
