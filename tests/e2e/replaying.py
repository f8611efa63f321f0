"""What every end-to-end suite checks of the sessions it recorded: replay shows the system
prompt the model read. For each call ``gateway replay ID --call N --json`` gives
``systemPrompt``; it must equal the concatenated text of the call's ``system`` blocks (the
Anthropic blocks a cache plan cuts the prompt into, or the one system message), as in the body
replay rebuilds and, where the suite has them, the bodies the provider received."""

from __future__ import annotations

import io
from collections.abc import Sequence
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import orjson

from app.cli import main as cli_main
from sessions.blob_files import FileBlobStore
from sessions.errors import SessionReadError
from sessions.names import DEFAULT_TENANT
from sessions.replay import Replay, replay_bytes
from sessions.replay_json import call_json


def replay_cli(data_dir: Path, *args: str) -> tuple[int, str]:
    """``gateway replay --data-dir DATA_DIR ARGS...``: exit code and stdout."""
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli_main(["replay", "--data-dir", str(data_dir), *args])
    return code, out.getvalue()


def system_read(body: dict[str, Any]) -> str | None:
    """The system prompt a request body carries, as the model reads it: Anthropic's ``system``
    (a string, or blocks read one after the other) or OpenAI's leading system message; None
    when it has none."""
    if "system" in body:
        system = body["system"]
        return system if isinstance(system, str) else "".join(b["text"] for b in system)
    messages = body.get("messages") or []
    if messages and messages[0].get("role") in ("system", "developer"):
        return str(messages[0]["content"])
    return None


def assert_shows_what_was_read(data_dir: Path, session: str, *, tenant: str | None = None,
                               received: Sequence[dict[str, Any]] | None = None) -> int:
    """For every call of ``session`` (under ``data_dir``, the CLI's way): ``--call N --json``
    ``systemPrompt`` is the text of the system blocks of ``--request N`` and, when given, of
    ``received[N-1]`` (the body the provider got for that call). The number of calls."""
    where = ["--tenant", tenant] if tenant else []
    code, whole = replay_cli(data_dir, session, *where, "--json")
    assert code == 0, whole
    calls = orjson.loads(whole)["calls"]
    if received is not None:
        assert len(received) == len(calls)
    for call in calls:
        n = str(call["index"])
        code, one = replay_cli(data_dir, session, *where, "--call", n, "--json")
        assert code == 0, one
        shown = orjson.loads(one)["systemPrompt"]
        assert call["status"] == "rebuilt", (n, call["why"])
        code, body = replay_cli(data_dir, session, *where, "--request", n)
        assert code == 0, body
        assert system_read(orjson.loads(body)) == shown, f"call {n}: blocks != systemPrompt"
        if received is not None:
            assert system_read(received[call["index"] - 1]) == shown, f"call {n} as received"
    return len(calls)


def assert_replay_shows_what_was_read(
    replay: Replay, received: Sequence[dict[str, Any]] | None = None,
    blobs: dict[str, bytes] | None = None,
) -> int:
    """:func:`assert_shows_what_was_read` for a replay already in hand (a store the CLI is not
    pointed at): the same ``call_json`` and ``Replay.request`` the CLI prints."""
    if received is not None:
        assert len(received) == len(replay.calls)
    for call in replay.calls:
        assert call.rebuildable, call.status_text
        shown = call_json(replay, call)["systemPrompt"]
        assert system_read(replay.request(call, blobs=blobs)) == shown, call.index
        if received is not None:
            assert system_read(received[call.index - 1]) == shown, call.index
    return len(replay.calls)


def session_logs(root: Path) -> list[tuple[Path, Path]]:
    """Every session log a JSONL store wrote under ``root`` (any data directory in it), with
    its data directory: ``DATA/sessions/ID.jsonl`` and ``DATA/tenants/T/sessions/ID.jsonl``."""
    found: list[tuple[Path, Path]] = []
    for log in sorted(root.rglob("*.jsonl")):
        if log.parent.name != "sessions":
            continue
        above = log.parent.parent
        data = above.parent.parent if above.parent.name == "tenants" else above
        found.append((log, data))
    return found


def check_every_log_under(root: Path) -> int:
    """:func:`assert_replay_shows_what_was_read` for every call replay can rebuild of every
    session log under ``root`` (attachment bytes from the logs' blob folders); how many calls
    were checked. A log that is not a session (a journal, an export) is skipped."""
    checked = 0
    for log, data in session_logs(root):
        try:
            replay = replay_bytes(log.read_bytes())
        except SessionReadError:
            continue
        tenant = log.parent.parent.name if log.parent.parent.parent.name == "tenants" \
            else DEFAULT_TENANT
        blobs = FileBlobStore(data)
        for call in replay.calls:
            if not call.rebuildable:
                continue  # nothing was recorded to compare with
            found: dict[str, bytes] = {}
            for ref in replay.attachments(call):
                path = blobs.path_of(tenant, ref.hash)
                if path.is_file():
                    found[ref.hash] = path.read_bytes()
            shown = call_json(replay, call)["systemPrompt"]
            assert system_read(replay.request(call, blobs=found)) == shown, (log, call.index)
            checked += 1
    return checked
