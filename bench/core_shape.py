"""The shape of the core, measured: modules per wing, import edges among the core's modules,
and the files one Telegram message runs through from the poller to the provider and back.

Each figure is taken of a source tree (``--root``, default this one), so the same script
measures an older commit checked out beside it (``git worktree add --detach ../old REV``) and
the figures can be put side by side. Every measurement runs in a child process whose import
path starts at that tree (and whose working directory is it), so it imports that tree's code;
the child checks that every module of ours it loaded came from there.

- **Modules per wing**: ``.py`` files under each package directly in ``gateway/`` (the
  wings), and the modules directly in ``gateway/``.
- **Import edges**: with grimp (installed with import-linter), the graph of ``gateway`` and its
  submodules; an edge is one module importing another module of the core (a package's
  ``__init__`` counts as a module). Also without the imports under ``if TYPE_CHECKING:``,
  and the longest chain of imports (levels) once cycles are collapsed.
- **Files of one message**: the tree's own Telegram fake (``tests/fakes/telegram_api.py``, the
  Bot API over HTTP, driven by the real PTB client) and its gateway (``build_gateway``, the
  offline provider, long polling). After two warm-up messages, a profile hook
  (``sys.setprofile``, every thread) notes each function of ours entered while one message
  goes from the fake's update queue to the reply the fake receives and the turn's end (no
  worker left); ``--messages`` such messages, each measured alone. Reported: the distinct
  files of ours (tests/ excluded), the packages they are in, and the *wall crossings*: the
  distinct (caller file, callee file) pairs whose top-level packages differ, the caller being
  the nearest frame of ours on the callee's stack (a coroutine resumed by the event loop has
  none).

Run: .venv/bin/python bench/core_shape.py [--root PATH ...] [--messages 5] [--json]
(several ``--root``: a table side by side, then each tree's report)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import types
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
OURS = ("gateway", "channels", "providers", "sessions", "coordination", "toolsets", "app")
"""Top-level packages of ours, in either layout (the old one had no ``providers``)."""


# -- modules per wing ------------------------------------------------------------------------

def modules_per_wing(root: Path) -> dict[str, int]:
    """``{wing: .py files under it}``, plus ``(direct)``: modules directly in ``gateway/``."""
    core = root / "gateway"
    counts = {"(direct)": len(list(core.glob("*.py")))}
    for wing in sorted(p for p in core.iterdir() if (p / "__init__.py").exists()):
        counts[wing.name] = sum(1 for p in wing.rglob("*.py") if p.name != "__init__.py")
    return counts


# -- import edges ----------------------------------------------------------------------------

def import_graph() -> dict[str, Any]:
    """In the child: the core's import graph (see the module docstring)."""
    import grimp

    out: dict[str, Any] = {}
    for label, exclude in (("all", False), ("runtime", True)):
        graph = grimp.build_graph("gateway", exclude_type_checking_imports=exclude,
                                  cache_dir=None)
        modules = sorted(graph.modules)
        edges = {(a, b) for a in modules for b in graph.find_modules_directly_imported_by(a)
                 if b in graph.modules}
        out[label] = {"modules": len(modules), "edges": len(edges),
                      "levels": _levels(modules, edges)}
        # The same without package __init__ modules, and without the provider adapters
        # (inside the core before the move, beside it after).
        plain = [m for m in modules if not _is_package(m)]
        kept = [m for m in plain if not m.startswith("gateway.providers.")]
        for name, subset in (("plain", plain), ("plain_no_providers", kept)):
            chosen = set(subset)
            inner = {(a, b) for a, b in edges if a in chosen and b in chosen}
            out[label][name] = {"modules": len(subset), "edges": len(inner),
                                "levels": _levels(sorted(subset), inner)}
    import importlib.util

    spec = importlib.util.find_spec("gateway")
    out["origin"] = spec.origin if spec is not None else None
    return out


def _is_package(module: str) -> bool:
    import importlib.util

    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def _levels(modules: list[str], edges: set[tuple[str, str]]) -> int:
    """The longest chain of imports, in modules, with each cycle counted as one module."""
    index = {m: i for i, m in enumerate(modules)}
    succ: dict[int, list[int]] = {i: [] for i in range(len(modules))}
    for a, b in edges:
        succ[index[a]].append(index[b])
    component = _components(len(modules), succ)
    dag: dict[int, set[int]] = {}
    for source, targets in succ.items():
        for target in targets:
            if component[source] != component[target]:
                dag.setdefault(component[source], set()).add(component[target])
    depth: dict[int, int] = {}

    def longest(c: int) -> int:
        if c not in depth:
            depth[c] = 1 + max((longest(d) for d in dag.get(c, ())), default=0)
        return depth[c]

    sys.setrecursionlimit(10_000)
    return max((longest(c) for c in set(component.values())), default=0)


def _components(n: int, succ: dict[int, list[int]]) -> dict[int, int]:
    """Strongly connected components (Tarjan), as ``{node: component id}``."""
    order: list[int] = []
    low: dict[int, int] = {}
    number: dict[int, int] = {}
    stack: list[int] = []
    on: set[int] = set()
    comp: dict[int, int] = {}

    def visit(v: int) -> None:
        number[v] = low[v] = len(number)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in number:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], number[w])
        if low[v] == number[v]:
            while True:
                w = stack.pop()
                on.discard(w)
                comp[w] = v
                if w == v:
                    break
        order.append(v)

    sys.setrecursionlimit(10_000)
    for v in range(n):
        if v not in number:
            visit(v)
    return comp


# -- files one Telegram message runs through --------------------------------------------------

class Recorder:
    """A profile hook noting the functions of ours entered while ``on`` (see the module
    docstring); installed before the gateway starts, so its threads run it too."""

    def __init__(self, root: Path) -> None:
        self.root = str(root) + os.sep
        self.on = False
        self.files: set[str] = set()
        self.edges: set[tuple[str, str]] = set()
        self._known: dict[str, str | None] = {}

    def ours(self, filename: str) -> str | None:
        """The root-relative path of a file of ours (tests/ and libraries: None)."""
        if filename not in self._known:
            rel = filename[len(self.root):] if filename.startswith(self.root) else None
            self._known[filename] = (rel if rel is not None and rel.split(os.sep)[0] in OURS
                                     else None)
        return self._known[filename]

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> None:
        if not self.on or event != "call":
            return
        callee = self.ours(frame.f_code.co_filename)
        if callee is None:
            return
        self.files.add(callee)
        caller_frame = frame.f_back
        for _ in range(64):
            if caller_frame is None:
                return
            caller = self.ours(caller_frame.f_code.co_filename)
            if caller is not None:
                if caller.split(os.sep)[0] != callee.split(os.sep)[0]:
                    self.edges.add((caller, callee))
                return
            caller_frame = caller_frame.f_back


async def trace_messages(root: Path, messages: int) -> dict[str, Any]:
    """In the child: the files of ours each of ``messages`` Telegram messages runs through."""
    recorder = Recorder(root)
    sys.setprofile(recorder)
    threading.setprofile(recorder)
    from app.compose import build_gateway
    from app.config import Settings
    from tests.fakes.telegram_api import FakeTelegramServer

    alice = 1001
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeTelegramServer() as fake:
            values: dict[str, Any] = {
                "GATEWAY_DATA_DIR": tmp, "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": 0,
                "GATEWAY_CHANNELS": "telegram", "GATEWAY_PROVIDER": "offline",
                "TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.base_url,
                "TELEGRAM_RATE_LIMIT": "off", "TELEGRAM_POLL_TIMEOUT": 1,
                "TELEGRAM_ALLOWED_USERS": str(alice), "GATEWAY_TYPING_DELAY": 0,
            }
            settings = Settings(_env_file=None, **values)  # type: ignore[call-arg]
            gateway = build_gateway(settings)
            await gateway.start()
            try:
                for n in range(2 + messages):
                    measured = n >= 2
                    if measured:
                        recorder.files, recorder.edges = set(), set()
                        recorder.on = True
                    fake.user_message(alice, f"message {n}")
                    # Only the fake's state and a plain attribute are read while measuring:
                    # waiting on an event of ours would run our code.
                    async with asyncio.timeout(60):
                        while (len(fake.texts_to(alice)) < n + 1  # noqa: ASYNC110 (see above)
                               or gateway.router._workers):
                            await asyncio.sleep(0.002)
                    recorder.on = False
                    if measured:
                        runs.append({"files": sorted(recorder.files),
                                     "edges": sorted(recorder.edges)})
            finally:
                await gateway.aclose()
    sys.setprofile(None)
    threading.setprofile(None)
    foreign = sorted(name for name, module in sys.modules.items()
                     if name.split(".")[0] in OURS and getattr(module, "__file__", None)
                     and not str(module.__file__).startswith(str(root)))
    return {"runs": runs, "foreign_modules": foreign}


# -- the report ------------------------------------------------------------------------------

def child(root: Path, what: str, messages: int) -> dict[str, Any]:
    """Run ``what`` in a child process importing from ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--root", str(root), "--child", what,
         "--messages", str(messages)],
        cwd=root, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} in {root} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def summary(root: Path, messages: int) -> dict[str, Any]:
    graph = child(root, "graph", messages)
    trace = child(root, "trace", messages)
    runs = trace["runs"]
    sizes = [len(r["files"]) for r in runs]
    union = sorted({f for r in runs for f in r["files"]})
    common = sorted(set.intersection(*(set(r["files"]) for r in runs))) if runs else []
    crossings = [len(r["edges"]) for r in runs]
    package_pairs = sorted({(a.split(os.sep)[0], b.split(os.sep)[0])
                            for r in runs for a, b in r["edges"]})
    return {
        "root": str(root), "commit": _commit(root), "wings": modules_per_wing(root),
        "graph": graph, "foreign_modules": trace["foreign_modules"],
        "files": {"per_message": sizes, "median": statistics.median(sizes) if sizes else 0,
                  "in_every_message": common, "in_any_message": union},
        "packages": dict(Counter(f.split(os.sep)[0] for f in common)),
        "crossings": {"per_message": crossings,
                      "median": statistics.median(crossings) if crossings else 0,
                      "package_pairs": [f"{a} -> {b}" for a, b in package_pairs]},
    }


def _commit(root: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def report(s: dict[str, Any]) -> str:
    g = s["graph"]
    lines = [f"## Core shape at {s['commit']} ({s['root']})", ""]
    lines.append("Modules per wing: " + ", ".join(f"{k} {v}" for k, v in s["wings"].items()))
    lines.append(f"Core import graph: {g['all']['modules']} modules, {g['all']['edges']} edges, "
                 f"{g['all']['levels']} levels; without TYPE_CHECKING imports "
                 f"{g['runtime']['edges']} edges, {g['runtime']['levels']} levels")
    f = s["files"]
    lines.append(f"Files of ours one Telegram message runs through: median {f['median']} "
                 f"(per message: {f['per_message']}); in every message "
                 f"{len(f['in_every_message'])}, in any {len(f['in_any_message'])}")
    lines.append("  by package (in every message): "
                 + ", ".join(f"{k} {v}" for k, v in sorted(s["packages"].items())))
    c = s["crossings"]
    lines.append(f"Package-wall crossings (distinct caller/callee file pairs): median "
                 f"{c['median']} (per message: {c['per_message']}); package pairs: "
                 + ", ".join(c["package_pairs"]))
    if s["foreign_modules"]:
        lines.append(f"WARNING: modules loaded from elsewhere: {s['foreign_modules']}")
    lines.append("")
    lines.append("Files in every message:")
    lines.extend(f"  {name}" for name in f["in_every_message"])
    return "\n".join(lines) + "\n"


def table(all_figures: list[dict[str, Any]]) -> str:
    """The headline figures of several trees, one column each."""
    rows: list[tuple[str, list[str]]] = [
        ("commit", [s["commit"] for s in all_figures]),
        ("modules directly in gateway/", [str(s["wings"]["(direct)"]) for s in all_figures]),
        ("wings (packages in gateway/)", [str(len(s["wings"]) - 1) for s in all_figures]),
        ("core modules (grimp, packages included)",
         [str(s["graph"]["all"]["modules"]) for s in all_figures]),
        ("core import edges", [str(s["graph"]["all"]["edges"]) for s in all_figures]),
        ("core modules / edges without package __init__ and gateway.providers",
         [f"{s['graph']['all']['plain_no_providers']['modules']} / "
          f"{s['graph']['all']['plain_no_providers']['edges']}" for s in all_figures]),
        ("import levels", [str(s["graph"]["all"]["levels"]) for s in all_figures]),
        ("files of ours per Telegram message (median)",
         [str(s["files"]["median"]) for s in all_figures]),
        ("packages those files are in", [str(len(s["packages"])) for s in all_figures]),
        ("package-wall crossings per message (median)",
         [str(s["crossings"]["median"]) for s in all_figures]),
    ]
    lines = ["| figure | " + " | ".join(s["commit"] for s in all_figures) + " |",
             "|---" * (len(all_figures) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(values) + " |" for name, values in rows[1:]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, action="append")
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    parser.add_argument("--child", choices=("graph", "trace"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    roots = [r.resolve() for r in args.root or [HERE]]
    if args.child is not None:
        sys.path.insert(0, str(roots[0]))  # that tree's code, whatever else is installed
    if args.child == "graph":
        print(json.dumps(import_graph()))
        return
    if args.child == "trace":
        print(json.dumps(asyncio.run(trace_messages(roots[0], args.messages))))
        return
    all_figures = [summary(root, args.messages) for root in roots]
    if args.json:
        print(json.dumps(all_figures, indent=2))
        return
    if len(all_figures) > 1:
        print(table(all_figures))
    for figures in all_figures:
        print(report(figures))


if __name__ == "__main__":
    main()
