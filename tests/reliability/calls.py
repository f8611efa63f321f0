"""The one check every fault test ends with: each call the provider received is either rebuilt
by replay exactly, or replay says it cannot rebuild it; never a different body."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from sessions.encoding import dumps
from sessions.replay import Call, NotRebuildableError, Replay


def same_body(a: Any, b: Any) -> bool:
    """Exact equality as JSON text (NaN equals itself; 1, 1.0 and True stay apart)."""
    return dumps(a) == dumps(b)


def check_calls(replay: Replay, turns: Sequence[Call], bodies: Sequence[dict[str, Any]],
                *, all_rebuilt: bool = False) -> None:
    """``turns[i]`` stands for the call whose body the provider received as ``bodies[i]``:
    rebuilt, it must equal it; otherwise replay must refuse to offer a body."""
    assert len(turns) == len(bodies), (len(turns), len(bodies))
    for turn, body in zip(turns, bodies, strict=True):
        if turn.rebuildable:
            assert same_body(replay.request(turn, "anthropic"), body), turn.index
        else:
            assert not all_rebuilt, f"turn {turn.index}: {turn.status_text}"
            assert turn.why
            with pytest.raises(NotRebuildableError):
                replay.request(turn, "anthropic")
