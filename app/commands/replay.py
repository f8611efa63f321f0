"""``gateway replay``: list sessions and rebuild every provider call of one, offline.

Words: a *turn* answers one message (a tool round makes it several calls); a *call* is one
provider request, numbered from 1 in the session. ``--call N`` picks a call; ``--turn N`` is
its old name, kept so older scripts and notes still work.

Read-only: it never writes to a session (``--rerun``, in :mod:`app.commands.rerun`, sends a
recorded call again and may save it to a separate log). Errors are one line starting
``gateway replay:``; exit 2 for usage errors and unknown sessions, 1 for unreadable files.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from app.commands import rerun_options
from app.commands.common import EXIT_UNREADABLE, EXIT_USAGE, CommandError
from sessions import blobs as blob_store
from sessions.attachments import human_size, ref_of
from sessions.blobs import BlobStore
from sessions.encoding import dumps
from sessions.errors import (
    BlobCorruptError,
    InvalidNameError,
    NotARegularFileError,
    SessionNotFoundError,
    SessionReadError,
)
from sessions.files import read_regular
from sessions.names import DEFAULT_TENANT
from sessions.replay import Call, Replay, replay_bytes
from sessions.replay_json import call_json, replay_json
from sessions.scan import message_text
from sessions.shapes import SHAPES, encode_body
from sessions.store import SessionStore

PROG = "gateway replay"
DESCRIPTION = """\
List sessions, or rebuild what the provider received in each call of one session, offline and
byte for byte (a call is one provider request; a turn that runs a tool makes two or more).
Never writes to a session; --rerun sends one recorded call again to compare answers."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", nargs="?", help="session id, or a path to a .jsonl file")
    parser.add_argument("--list", action="store_true", help="list sessions, newest first")
    parser.add_argument("--tenant", default=None, help=f"tenant (default: {DEFAULT_TENANT}, "
                        "else the one tenant that has the session)")
    parser.add_argument("--call", "--turn", type=int, metavar="N", dest="call",
                        help="show call N (1-based) verbatim: system prompt, tools, messages "
                             "(--turn is its old name)")
    parser.add_argument("--request", type=int, metavar="N",
                        help="print call N's exact provider request body as JSON")
    parser.add_argument("--shape", choices=SHAPES, default=None,
                        help="request shape for --request (default: the recorded provider's)")
    parser.add_argument("--raw", action="store_true",
                        help="with --request: the exact bytes sent (compact JSON, no newline)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where sessions live (GATEWAY_DATA_DIR)")
    rerun_options.add_arguments(parser)


async def load(store: SessionStore, target: str, tenant: str | None) -> Replay:
    """Read and replay a session given by id (in ``tenant``) or by path. An id without a
    tenant is the default tenant's, else that of the one tenant that has it: ids from
    ``--list`` name sessions of every tenant, and the web chat's are the ``web`` tenant's."""
    data = await _read(store, target, tenant)
    try:
        return replay_bytes(data)
    except SessionReadError as exc:
        raise CommandError(f"{target}: {exc}", EXIT_UNREADABLE) from exc


async def _read(store: SessionStore, target: str, tenant: str | None) -> bytes:
    if target.endswith(".jsonl") or "/" in target:
        path = Path(target)
        try:
            # The operator named this path, so a symlink is followed; a FIFO or a device is
            # still refused (one would hang the read, the other never end it).
            return await asyncio.to_thread(read_regular, path, follow=True)
        except FileNotFoundError as exc:
            raise CommandError(f"no such file: {target}", EXIT_USAGE) from exc
        except NotARegularFileError as exc:
            raise CommandError(f"cannot read {target}: {exc}", EXIT_UNREADABLE) from exc
        except OSError as exc:
            raise CommandError(f"cannot read {target}: {exc.strerror}", EXIT_UNREADABLE) from exc
    try:
        return await store.read_log(tenant or DEFAULT_TENANT, target)
    except InvalidNameError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    except SessionNotFoundError as exc:
        holders = sorted({info.tenant for info in await store.list_sessions(None)
                          if info.session_id == target})
        if tenant is None and len(holders) == 1:
            return await _read(store, target, holders[0])
        raise CommandError(f"{exc}{_elsewhere(holders)}", EXIT_USAGE) from exc
    except SessionReadError as exc:
        raise CommandError(f"cannot read session {target}: {exc}", EXIT_UNREADABLE) from exc
    except OSError as exc:
        raise CommandError(f"cannot read session {target}: {exc.strerror}",
                           EXIT_UNREADABLE) from exc


def _elsewhere(holders: list[str]) -> str:
    """What finds a session the tenant asked for lacks: the tenants that have it."""
    if not holders:
        return ""
    if len(holders) == 1:
        return f"; it is in tenant {holders[0]!r}: add --tenant {holders[0]}"
    return f"; tenants {', '.join(map(repr, holders))} have it: add --tenant with one of them"


async def run(args: argparse.Namespace, store: SessionStore, out: TextIO | None = None,
              data_dir: Path | None = None, blobs: BlobStore | None = None) -> int:
    out = out or sys.stdout  # looked up per call, so redirect_stdout works
    rerun_options.check_options(args)
    if args.raw and args.request is None:
        raise CommandError("--raw only applies with --request N")
    if args.list:
        return await _list(store, args.tenant, out, as_json=args.json)
    if not args.session:
        raise CommandError("give a session id (or --list)")
    replay = await load(store, args.session, args.tenant)
    if args.rerun is not None:  # the one mode that sends a request (never writes the session)
        from app.commands import rerun as rerun_cmd  # the providers, only for a rerun

        return await rerun_cmd.run(args, replay, out, data_dir, blobs)
    if args.request is not None:
        call = _call(replay, args.request)
        if not call.rebuildable:
            raise CommandError(f"session {replay.session_id}: call {call.index} cannot be "
                               f"rebuilt: {call.status_text}", EXIT_UNREADABLE)
        try:  # a missing or damaged blob: which one, which call; never a body without it
            found = await call_blobs(replay, call, blobs, args.tenant)
        except BlobCorruptError as exc:
            raise CommandError(f"session {replay.session_id}: call {call.index} cannot be "
                               f"rebuilt: {exc}", EXIT_UNREADABLE) from exc
        try:
            body = replay.request(call, args.shape, found)
        except SessionReadError as exc:
            raise CommandError(f"session {replay.session_id}: {exc}", EXIT_UNREADABLE) from exc
        if args.raw:
            out.write(encode_body(body).decode())
        else:
            _dump(body, out)
    elif args.call is not None:
        call = _call(replay, args.call)
        if args.json:
            _dump(call_json(replay, call), out)
        else:
            _print_call(replay, call, out)
    elif args.json:
        _dump(replay_json(replay), out)
    else:
        print_summary(replay, out)
    return 0


async def call_blobs(replay: Replay, call: Call, blobs: BlobStore | None,
                     tenant: str | None) -> dict[str, bytes]:
    """The attachment bytes ``call``'s request needs, from the session's tenant's blobs."""
    refs = replay.attachments(call)
    if not refs or blobs is None:
        return {}
    owner = tenant or replay.header.get("tenant")
    return await blob_store.load(blobs, owner if isinstance(owner, str) else DEFAULT_TENANT,
                                 refs)


def _call(replay: Replay, number: int) -> Call:
    try:
        return replay.call(number)
    except IndexError as exc:
        raise CommandError(
            f"session {replay.session_id} has no call {number} (it has {len(replay.calls)})"
        ) from exc


def _dump(value: Any, out: TextIO) -> None:
    out.write(dumps(value, indent=True).decode())
    out.write("\n")


def short(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


async def _list(store: SessionStore, tenant: str | None, out: TextIO, *, as_json: bool) -> int:
    try:
        infos = await store.list_sessions(tenant)
    except InvalidNameError as exc:
        raise CommandError(str(exc)) from exc
    if as_json:
        _dump([{
            "id": i.session_id, "tenant": i.tenant, "startedAt": i.started_at,
            "channel": i.channel, "conversation": i.conversation, "generation": i.generation,
            "version": i.version,
            "messages": i.message_count, "firstUserText": i.first_user_text,
            "bytes": i.size_bytes, "torn": i.torn, "error": i.error,
            "scheduled": i.scheduled,
        } for i in infos], out)
        return 0
    if not infos:
        out.write("(no sessions)\n")
        return 0
    rows: list[tuple[str, ...]] = [(
        info.session_id, info.started_at or "-", info.channel or "-", info.conversation or "-",
        str(info.message_count),
        repr(short(info.first_user_text, 40))
        + (" (torn tail)" if info.torn else "") + (f" ({info.error})" if info.error else ""),
    ) for info in infos]
    header: tuple[str, ...] = ("SESSION", "STARTED", "CHANNEL", "CONVERSATION", "MESSAGES",
                               "FIRST MESSAGE")
    if any(info.scheduled for info in infos):  # turns a schedule started, not a person
        header = (*header[:-1], "SCHEDULED", header[-1])
        rows = [(*row[:-1], str(info.scheduled or ""), row[-1])
                for info, row in zip(infos, rows, strict=True)]
    if any(info.tenant != DEFAULT_TENANT for info in infos):
        header = (header[0], "TENANT", *header[1:])
        rows = [(row[0], info.tenant, *row[1:]) for info, row in zip(infos, rows, strict=True)]
    out.write(table(header, rows))
    return 0


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last one is left ragged."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]])
             for r in [header, *rows]]
    return "".join(f"{line.rstrip()}\n" for line in lines)


def describe(message: dict[str, Any]) -> str:
    """One readable line for a message: text, tool calls and tool results."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            args = dumps(block.get("input")).decode()
            parts.append(f"<tool_use {block.get('name')} {args}>")
        elif kind == "tool_result":
            result = message_text(block.get("content")) or ""
            error = " error" if block.get("is_error") else ""
            parts.append(f"<tool_result{error} {block.get('tool_use_id')}: {result}>")
            parts.extend(attachment_label(b) for b in block.get("content") or []
                         if isinstance(b, dict) and b.get("type") == "attachment")
        elif kind == "attachment":
            parts.append(attachment_label(block))
        else:
            parts.append(f"<{kind}>")
    return " ".join(parts)


def attachment_label(block: dict[str, Any]) -> str:
    """``<attachment photo.jpg image/jpeg 48.2 KB sha256:…>`` (``<sent file ...>`` for files
    the agent sent), with the transcript of a voice note."""
    ref = ref_of(block)
    if ref is None:
        return "<attachment (malformed)>"
    what = "sent file" if block.get("sent") is True else "attachment"
    label = f"<{what} {ref.name} {ref.media_type} {human_size(ref.size)} sha256:{ref.hash}>"
    transcript = block.get("transcript")
    return f"{label} transcript: {transcript}" if isinstance(transcript, str) else label


def print_summary(replay: Replay, out: TextIO) -> None:
    """What ``gateway replay`` prints of a session: public, so the tests read the summary
    of a replay they built without running the command on files."""
    h = replay.header
    w = out.write
    w(f"session {replay.session_id}  (format v{replay.version})\n")
    w(f"  started {h.get('startedAt', '-')}  channel {h.get('channel', '-')}  "
      f"conversation {h.get('conversation', '-')}  tenant {h.get('tenant', DEFAULT_TENANT)}\n")
    rerun = replay.rerun_of
    if rerun is not None:
        number = rerun.call if rerun.call is not None else "?"
        w(f"  rerun of call {number} of session {rerun.session}"
          f"{f' (tenant {rerun.tenant})' if rerun.tenant else ''}\n")
    w(f"  messages {len(replay.messages)}  calls {len(replay.calls)}  "
      f"prompts recorded: {'yes' if replay.prompts_recorded else 'no'}\n")
    if replay.notice:
        w(f"notice: {replay.notice}\n")
    if replay.torn_tail:
        w("note: the last line is torn (an interrupted write) and was skipped\n")
    for problem in replay.problems:
        w(f"problem: line {problem.line}: {problem.message}\n")
    for gap in replay.gaps:
        what = ", ".join(_refused(item) for item in gap.refused)
        w(f"gap: line {gap.line}: the log refused {what} ({gap.kind} at {gap.at or '?'})\n")
    for r in replay.refusals:
        w(f"refused: line {r.line}  {r.ts or '-'}  message {r.after} got the {r.limit} "
          f"limit's notice (until {r.until or '?'}), no provider call\n")
    for reply in replay.replies:
        what = "an apology" if reply.kind == "apology" else f"a {reply.kind}"
        w(f"replied: line {reply.line}  {reply.ts or '-'}  message {_index(reply.message)} "
          f"got {what}, no model answer\n")
    if replay.deliveries:
        w(f"delivered: {len(replay.deliveries)} platform message(s) noted as carrying answers "
          f"(--json lists them)\n")
    w("prompt timeline:\n")
    if not replay.prompts:
        w("  (none)\n")
    for v in replay.prompts:
        first = v.first_call if v.first_call is not None else "none"
        names = ",".join(s.name for s in v.sections)
        check = "" if v.verified else "  UNVERIFIED"
        w(f"  #{v.number}  {v.ts or '-'}  {v.fingerprint}  {v.reason or '-'}  "
          f"first call {first}  [{names}]{check}\n")
    w("calls:\n")
    for t in replay.calls:
        prompt = f"prompt #{t.prompt.number}" if t.prompt else "prompt -"
        sent = f"{len(replay.sent(t))} msgs" if t.window is not None else "window -"
        model = f"  {t.model}" if t.model else ""
        answer = describe(replay.messages[t.assistant]) if t.assistant is not None else ""
        outcome = replay.outcome_of(t)
        if outcome is not None and outcome.error:
            answer = f"[error {outcome.error.get('kind', '?')}] {answer}"
        elif t.assistant is None:
            answer = "[no answer recorded]"
        w(f"  {t.index:>3}  {t.ts or '-'}  {prompt}  {sent}{model}  -> {short(answer)}\n")
        if not t.rebuildable:
            w(f"       {t.status_text}\n")
        for note in t.notes:
            w(f"       note: {note}\n")


def _refused(item: Any) -> str:
    kind = item.get("type", "?") if isinstance(item, dict) else "?"
    if kind == "message":
        return f"a {item.get('role', '?')} message"
    if kind == "outcome":
        return f"the outcome of call {item.get('call', '?')}"
    return f"a {kind} entry"


def _print_call(replay: Replay, call: Call, out: TextIO) -> None:
    w = out.write
    w(f"=== call {call.index} of session {replay.session_id}: {call.status_text}\n")
    for note in call.notes:
        w(f"note: {note}\n")
    if call.model:
        w(f"provider {call.provider or '-'}  model {call.model}  params "
          f"{dumps(call.params).decode()}\n")
    if call.prompt is not None:
        v = call.prompt
        w(f"--- system prompt #{v.number} {v.fingerprint} ({v.reason or '-'})\n")
        read = replay.system_text(call)
        w(read if read is not None else "[prompt text could not be rebuilt; see problems]")
        w("\n")
    else:
        w(f"--- system prompt: {call.prompt_notice or 'not recorded'}\n")
    tools = replay.tools_of(call)
    if tools is not None:
        w(f"--- tools: {', '.join(str(t.get('name')) for t in tools)}\n")
    if call.window is None:
        w("--- messages sent: not recorded\n")
    else:
        sent = replay.sent(call)
        w(f"--- messages sent ({len(sent)})\n")
        for message in sent:
            w(f"[{message.get('role')}] {describe(message)}\n")
    w("--- assistant\n")
    if call.assistant is not None:
        w(describe(replay.messages[call.assistant]) + "\n")
    else:
        outcome = replay.outcome_of(call)
        w(f"[no answer: {outcome.error if outcome and outcome.error else 'not recorded'}]\n")


def _index(value: int | None) -> str:
    return "?" if value is None else str(value)
