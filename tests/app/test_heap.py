"""``freeze_heap``: what start-up built leaves the collector's generations, its garbage does not
survive. Run in a child process, so this test process's own heap is never frozen."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import gc, weakref
    from app.server import freeze_heap

    class Node:
        pass

    kept = [Node() for _ in range(1000)]   # lives on, like a client built at start-up
    garbage = Node()
    garbage.me = garbage                   # a cycle only the collector can free
    dead = weakref.ref(garbage)
    del garbage
    gc.disable()                           # no collection but freeze_heap's own
    freeze_heap()
    assert dead() is None, "start-up garbage was frozen instead of collected"
    assert gc.get_freeze_count() > len(kept), gc.get_freeze_count()
    print("ok")
""")


def test_start_up_objects_are_frozen_and_its_garbage_collected() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
