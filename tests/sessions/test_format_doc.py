"""docs/session-format.md stays true: its example replays cleanly and its strings match code."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from sessions import replay as replay_module
from sessions.erased import marker
from sessions.fingerprint import tools_fingerprint
from sessions.replay import replay_bytes
from tests.sessions.helpers import sha16

DOC = Path(__file__).resolve().parents[2] / "docs" / "session-format.md"


def example_bytes() -> bytes:
    match = re.search(r"```jsonl\n(.*?)\n```", DOC.read_text(encoding="utf-8"), re.S)
    assert match is not None
    return match.group(1).encode("utf-8") + b"\n"


def test_documented_example_replays_as_described() -> None:
    """The example has 21 lines, 4 turns (one failed), 2 verified prompts and no problems."""
    data = example_bytes()
    replay = replay_bytes(data)
    assert (replay.problems, replay.torn_tail, replay.notice) == ((), False, None)
    assert len(data.splitlines()) == 21
    assert [(t.index, t.entry_number, t.assistant, t.prompt.number if t.prompt else None)
            for t in replay.calls] == [(1, 0, 1, 1), (2, 1, 3, 1), (3, 2, None, 2), (4, 3, 5, 2)]
    assert [(v.first_call, v.verified) for v in replay.prompts] == [(1, True), (3, True)]
    assert [len(replay.sent(t)) for t in replay.calls] == [1, 3, 3, 3]


def test_documented_example_fingerprints_follow_the_definitions() -> None:
    """Section hashes, prompt fingerprints and the tool fingerprint match the documented rules."""
    lines = [orjson.loads(raw) for raw in example_bytes().splitlines()]
    sections = {e["hash"]: e["text"] for e in lines if e["type"] == "section"}
    assert all(sha16(text) == h for h, text in sections.items())
    for prompt in (e for e in lines if e["type"] == "prompt"):
        text = "\n\n".join(sections[ref["hash"]] for ref in prompt["sections"])
        assert sha16(text) == prompt["fingerprint"]
    (tools,) = [e for e in lines if e["type"] == "tools"]
    assert tools_fingerprint(tools["tools"]) == tools["fingerprint"]


def test_documented_notices_are_the_exact_strings() -> None:
    """Every notice constant appears in the doc's table with its exact text."""
    doc = DOC.read_text(encoding="utf-8")
    for name in ("NOTICE_V1", "NOTICE_NO_PROMPTS", "NOTICE_BEFORE_FIRST",
                 "NOTICE_CALL_UNRECORDED", "NOTICE_PROMPT_MISSING"):
        assert f"| `{name}` | `{getattr(replay_module, name)}` |" in doc, name


# Lines provoking each kind of damage listed in the doc's Problems table.
DAMAGED = b"""\
{"type":"session","version":3,"seq":0}
{not json
[1]
{"type":"message","message":{"role":"user","content":"no seq"}}
{"type":"message","seq":5,"message":{"role":"user","content":"gap"}}
{"type":"message","seq":5,"message":{"role":"user"}}
{"type":"session","seq":6}
{"type":"section","seq":7,"hash":"x"}
{"type":"section","seq":8,"hash":"0000000000000000","text":"abc"}
{"type":"prompt","seq":9,"sections":[]}
{"type":"prompt","seq":10,"fingerprint":"f","sections":[5]}
{"type":"prompt","seq":11,"fingerprint":"f","sections":[{"name":"a","hash":"1111111111111111"}]}
{"type":"prompt","seq":12,"fingerprint":"ffff","sections":[{"name":"a","hash":"0000000000000000"}]}
{"type":"prompt","seq":13,"fingerprint":"f"}
{"type":"tools","seq":14,"fingerprint":"t"}
{"type":"tools","seq":15,"fingerprint":"t","tools":[1]}
{"type":"call","seq":16,"call":0,"prompt":"ffff","tools":null,"window":[[0,9]]}
{"type":"call","seq":17,"call":1,"prompt":"ffff","tools":null,"window":[],"injected":5}
{"type":"call","seq":18,"call":2,"prompt":"ffff","tools":"zzz","window":[]}
{"type":"message","seq":19,"message":{"role":"assistant","content":"end"}}
{"type":"gap","seq":20,"kind":"BROKEN"}
"""


def test_documented_problems_are_exactly_those_replay_emits() -> None:
    """A log with every kind of damage yields each documented problem, and no undocumented one."""
    doc = DOC.read_text(encoding="utf-8")
    table = doc[doc.index("## Problems"):doc.index("### Errors that stop a replay")]
    documented = re.findall(r"^\| `([^`]+)` \|", table, re.M)
    # The doc writes N, M for numbers and H, F for hashes/fingerprints.
    numbers, hashes = re.compile(r"\b[NM]\b"), re.compile(r"\b[HF]\b")
    patterns = {
        text: re.compile(hashes.sub(r"\\S+", numbers.sub(r"\\d+", re.escape(text))))
        for text in documented
    }
    emitted = [p.message for p in replay_bytes(DAMAGED).problems]
    matched = {text for text, rx in patterns.items() for m in emitted if rx.fullmatch(m)}
    unmatched = [m for m in emitted if not any(rx.fullmatch(m) for rx in patterns.values())]
    assert (sorted(matched), unmatched) == (sorted(documented), [])


def test_documented_marker_is_the_one_erasure_writes() -> None:
    """The "Erased messages" example has exactly the keys, order and values sessions.erased
    writes for a user message of that seq, ts and item."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"\n    (\{\"type\":\"message\",\"seq\":12.*?\}\})\n\n", text, re.S)
    assert match is not None
    documented = orjson.loads(re.sub(r"\n\s+", "", match.group(1)))
    entry = {"type": "message", "seq": 12, "ts": documented["ts"],
             "message": {"role": "user", "content": "what the person said"},
             "meta": {"sender": "1001", "name": "Ada", "item": documented["meta"]["item"]}}
    written = marker(entry, subject=documented["erased"]["subject"],
                     at=documented["erased"]["at"])
    assert list(written) == list(documented)
    assert written == documented
