"""``gateway replay ID --rerun N``: send a recorded call again, as recorded or ablated.

The request is rebuilt from the log by :func:`sessions.ablation.rerun_request` (system prompt
from its recorded sections, the recorded window of messages, tools, model and params), changed
only as asked (``--drop-section``, ``--replace-section``, ``--model``, ``--provider``), sent,
and the new answer is printed after the recorded one. When the new answer calls tools, each
gets the result the session recorded for the same call of the same round (or, with
``--live-tools``, a fresh one from the configured MCP servers, compared with the recorded one)
and the rerun goes on like the agent loop; a call with no such result, or whose arguments
differ from the recorded call's, is shown, not executed, and ends the rerun (see
:mod:`app.commands.rerun_tools`). Persona tools never run, so the persona files never change.

It never writes to the original session. ``--save`` writes the rerun, exactly as a live call is
persisted, into its own v3 log ``<data_dir>/reruns/<tenant>/<rerun-id>.jsonl`` (0600 files,
0700 directories) whose header names the call it reruns (``rerunOf``) and the ablation.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from app.commands.common import EXIT_UNREADABLE, EXIT_USAGE, CommandError
from app.commands.rerun_options import PROVIDERS
from app.commands.rerun_tools import (
    MISMATCH,
    MISSING,
    NOT_RUN,
    RecordedRounds,
    ToolStep,
    resolve,
    results_message,
)
from app.commands.run import load_settings
from app.compose_providers import build_provider
from app.compose_store import RERUNS_DIR, rerun_store
from app.compose_tools import live_tool_set
from app.config import Settings
from gateway.edge.errors import ConfigError, ProviderError
from gateway.edge.messages import ChannelContext
from gateway.edge.provider import Provider, ProviderRequest
from sessions import entries
from sessions.ablation import Ablation, RerunError, RerunParts, rerun_request
from sessions.attachments import needed
from sessions.blobs import BlobStore, load
from sessions.caching import glued_at
from sessions.encoding import dumps
from sessions.errors import (
    BlobCorruptError,
    BlobMissingError,
    InvalidNameError,
    SessionExistsError,
    SessionWriteError,
)
from sessions.fingerprint import fingerprint
from sessions.names import DEFAULT_TENANT, validate_tenant
from sessions.persist import persist_call
from sessions.records import MessageDict, Outcome
from sessions.replay import Call, Replay
from sessions.replay_json import outcome_json
from sessions.store import SessionStore, SessionWriter

EXIT_FAILED = 1
_ERROR_TEXT_LIMIT = 300


@dataclass(frozen=True, slots=True)
class Answer:
    """What the rerun call returned (``message`` is None when it failed)."""

    message: MessageDict | None
    stop_reason: str | None
    usage: Mapping[str, int]
    latency_ms: float
    error: ProviderError | None


async def run(
    args: argparse.Namespace, replay: Replay, out: TextIO, data_dir: Path | None,
    blobs: BlobStore | None = None,
) -> int:
    """Rerun call ``args.rerun`` of ``replay`` (options already passed :func:`check_options`);
    0 when the provider answered, 1 when it failed."""
    try:
        call = replay.call(args.rerun)
    except IndexError as exc:
        raise CommandError(f"session {replay.session_id} has no call {args.rerun} "
                           f"(it has {len(replay.calls)})") from exc
    files = _replacement_files(args.replace_section)
    ablation = Ablation(drop=tuple(args.drop_section),
                        replace={name: text for name, (_, text) in files.items()})
    try:
        parts = rerun_request(replay, call, ablation, model=args.model)
    except RerunError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    if args.save and data_dir is None:
        raise CommandError("--save needs a data directory (--data-dir or GATEWAY_DATA_DIR)")
    owner = args.tenant or replay.header.get("tenant")
    owner = owner if isinstance(owner, str) else DEFAULT_TENANT
    found = await _attachments(parts.messages, blobs, owner, call.index, {})
    provider, notes = _choose_provider(args.provider, parts.provider)
    try:
        same = provider.name == parts.provider
        model = parts.model or provider.model
        params = dict(parts.params) if same and parts.params is not None else provider.params()
        notes += _notes(replay, parts, provider.name, same, args.model)
        glued = glued_at(parts.cache, parts.prompt.texts)
        if glued is not None and provider.shape == "anthropic":
            notes.append(f"the call was sent with an older prompt-cache split that ran sections "
                         f"{glued} and {glued + 1} together; the rerun sends it the same way")
        saved: Path | None = None
        writer: SessionWriter | None = None
        store: SessionStore | None = None
        try:
            if args.save:
                assert data_dir is not None
                store, writer = await _open_log(data_dir, replay, parts, args, files)
                saved = data_dir / RERUNS_DIR / writer.tenant / f"{writer.session_id}.jsonl"
            steps = await _converse(provider, replay, call, parts, model, params, writer,
                                    live_tools=args.live_tools,
                                    files=Files(blobs, owner, call.index, found))
        except (SessionWriteError, OSError) as exc:
            raise CommandError(f"cannot save the rerun: {exc}", EXIT_UNREADABLE) from exc
        finally:
            if writer is not None:
                await writer.aclose()
            if store is not None:
                await store.aclose()
    finally:
        await provider.aclose()
    answer = steps[-1].answer
    view = _view(replay, parts, provider.name, model, params, notes, files, steps, saved)
    if args.json:
        out.write(dumps(view, indent=True).decode() + "\n")
    else:
        _print(view, out)
    if answer.error is not None:
        sys.stderr.write(f"gateway replay: rerun failed: {answer.error}\n")
        return EXIT_FAILED
    return 0


def _replacement_files(specs: Sequence[str]) -> dict[str, tuple[str, str]]:
    """``S=FILE`` options as section name -> (absolute file path, its text)."""
    found: dict[str, tuple[str, str]] = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise CommandError(f"--replace-section wants S=FILE, got {spec!r}")
        if name in found:
            raise CommandError(f"--replace-section {name} given twice")
        try:
            text = Path(file).read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise CommandError(f"no such file: {file}") from exc
        except UnicodeDecodeError as exc:
            raise CommandError(f"{file} is not UTF-8 text") from exc
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror}", EXIT_UNREADABLE) from exc
        found[name] = (str(Path(file).resolve()), text)
    return found


def _choose_provider(requested: str | None, recorded: str | None) -> tuple[Provider, list[str]]:
    """The provider to rerun with, built from settings, and a note when the default (the
    recorded provider) could not be used."""
    notes: list[str] = []
    if requested is not None:
        name = requested
    elif recorded not in PROVIDERS:
        name = "offline"
        notes.append(f"recorded provider {recorded or '(not recorded)'} cannot be built from "
                     "settings; rerunning with offline")
    else:
        assert recorded is not None
        missing = _unconfigured(load_settings(GATEWAY_PROVIDER=recorded), recorded)
        name = recorded if missing is None else "offline"
        if missing is not None:
            notes.append(f"recorded provider {recorded} is not configured ({missing}); "
                         "rerunning with offline")
    settings = load_settings(GATEWAY_PROVIDER=name)
    missing = _unconfigured(settings, name)
    if missing is not None:  # only for an explicit --provider: never call a default URL keyless
        raise CommandError(f"--provider {name}: {missing}")
    try:
        return build_provider(settings), notes
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc


def _unconfigured(settings: Settings, name: str) -> str | None:
    """Why ``name`` cannot be built from ``settings``, or None when it can."""
    if name == "anthropic" and settings.anthropic_api_key is None:
        return "ANTHROPIC_API_KEY is not set"
    if name == "openai" and settings.openai_api_key is None and not settings.openai_base_url:
        return "neither OPENAI_API_KEY nor OPENAI_BASE_URL is set"
    return None


def _notes(replay: Replay, parts: RerunParts, provider: str, same: bool,
           model_given: str | None) -> list[str]:
    notes: list[str] = []
    call = replay.call(parts.call)
    if call.prompt is None:
        notice = call.prompt_notice or "not recorded"
        notes.append(f"system prompt of this call: {notice}; the rerun sends none")
    elif not call.prompt.verified:
        notes.append("the recorded prompt does not match its fingerprint (see replay problems)")
    if parts.params is None:
        notes.append(f"params were not recorded; using {provider}'s own")
    elif not same:
        notes.append(f"params are {provider}'s own (the recorded ones are {parts.provider}'s)")
    if not same and not model_given and parts.model is not None and provider != "offline":
        notes.append(f"model {parts.model} is the recorded one; pass --model for {provider}")
    return notes


async def _attachments(messages: Sequence[MessageDict], blobs: BlobStore | None, owner: str,
                       number: int, have: Mapping[str, bytes]) -> dict[str, bytes]:
    """``have`` plus the bytes of the attachments ``messages`` refer to that it lacks; a
    missing one stops the rerun, named."""
    refs = [ref for ref in needed(messages) if ref.hash not in have]
    try:
        found = {} if not refs or blobs is None else await load(blobs, owner, refs)
    except BlobCorruptError as exc:
        raise CommandError(f"call {number} cannot be rebuilt: {exc}", EXIT_UNREADABLE) from exc
    for ref in refs:
        if ref.hash not in found:
            raise CommandError(str(BlobMissingError(ref.hash, ref.label(), call=number)),
                               EXIT_UNREADABLE)
    return {**have, **found}


@dataclass(frozen=True, slots=True)
class Files:
    """Where the rerun's attachment bytes come from: the session's tenant's blob store, and
    those loaded so far (a tool round can add some: an image a tool returned)."""

    store: BlobStore | None
    owner: str
    number: int
    loaded: Mapping[str, bytes]

    async def more(self, messages: Sequence[MessageDict]) -> Files:
        found = await _attachments(messages, self.store, self.owner, self.number, self.loaded)
        return dataclasses.replace(self, loaded=found)


@dataclass(frozen=True, slots=True)
class Step:
    """One call of the rerun and the tool calls its answer made (with their results)."""

    answer: Answer
    tools: tuple[ToolStep, ...] = ()


async def _converse(provider: Provider, replay: Replay, call: Call, parts: RerunParts,
                    model: str, params: Mapping[str, Any], writer: SessionWriter | None, *,
                    live_tools: bool, files: Files) -> list[Step]:
    """Send the recorded request; while the answer asks for tools whose results can be had
    (recorded, or live with ``--live-tools``), give them and call again, as the agent loop
    would, up to ``GATEWAY_MAX_ITERATIONS`` calls. Each call is saved when ``writer`` is set.
    Files in tool results (recorded references, or images a live tool returned, stored like
    in a turn) are loaded before the call that sends them."""
    settings = load_settings()
    recorded = RecordedRounds(replay, call)
    tenant = str(replay.header.get("tenant") or DEFAULT_TENANT)
    context = ChannelContext(channel="rerun", chat_type="private", speaker=None, tenant=tenant)
    messages = list(parts.messages)
    steps: list[Step] = []
    async with live_tool_set(settings, tenant, enabled=live_tools, provider=provider,
                             blobs=files.store) as live:
        for attempt in range(settings.max_iterations):
            if writer is not None:
                await persist_call(writer, parts.call_request(
                    provider.name, model, params, messages=messages,
                    endpoint=provider.endpoint))
            answer = await _send(provider, parts, messages, model, params, files.loaded)
            if writer is not None:
                await _record(writer, answer, attempt)
            uses = _tool_calls(answer.message)
            if answer.message is None or not uses:
                steps.append(Step(answer))
                break
            results = await resolve(uses, recorded, attempt, live, context)
            steps.append(Step(answer, tuple(results)))
            if any(r.source in NOT_RUN for r in results):
                break  # never make up a result the model would take for real
            messages += [answer.message, results_message(results)]
            files = await files.more(messages[-1:])
    return steps


async def _send(provider: Provider, parts: RerunParts, messages: Sequence[MessageDict],
                model: str, params: Mapping[str, Any], blobs: Mapping[str, bytes]) -> Answer:
    request = ProviderRequest(system=parts.prompt.text, messages=list(messages),
                              tools=parts.tools, model=model, params=params,
                              sections=parts.prompt.texts,
                              cache=parts.cache if provider.shape == "anthropic" else None,
                              blobs=blobs)
    started = time.perf_counter()
    try:
        # No on_text: the answer is shown whole, next to the recorded one. A recorded
        # "stream": true is still sent as is, so the body equals the recorded body.
        response = await provider.complete(request)
    except ProviderError as exc:
        return Answer(None, None, {}, (time.perf_counter() - started) * 1000, exc)
    return Answer(response.message, response.stop_reason, dict(response.usage),
                  (time.perf_counter() - started) * 1000, None)


# -- the rerun log ------------------------------------------------------------------------------


async def _open_log(data_dir: Path, replay: Replay, parts: RerunParts,
                    args: argparse.Namespace,
                    files: Mapping[str, tuple[str, str]]) -> tuple[SessionStore, SessionWriter]:
    """Create ``<data_dir>/reruns/<tenant>/<id>.jsonl`` with its header written."""
    recorded_tenant = replay.header.get("tenant")
    tenant = recorded_tenant if isinstance(recorded_tenant, str) else args.tenant
    try:
        tenant = validate_tenant(tenant or DEFAULT_TENANT)
    except InvalidNameError as exc:
        raise CommandError(str(exc)) from exc
    store = rerun_store(data_dir)
    extra = {
        "rerunOf": {"session": replay.session_id, "tenant": tenant, "call": parts.call,
                    "promptFingerprint": parts.recorded_fingerprint},
        "ablation": {
            "drop": list(parts.dropped),
            "replace": {name: {"file": file, "hash": fingerprint(text)}
                        for name, (file, text) in files.items()},
        },
    }
    try:
        # The store retries an id two reruns in the same second both drew.
        writer = await store.create(tenant=tenant, channel="rerun",
                                    conversation=replay.session_id or "-", extra=extra)
    except SessionExistsError as exc:
        await store.aclose()
        raise CommandError("cannot pick a fresh rerun id", EXIT_UNREADABLE) from exc
    except BaseException:
        await store.aclose()
        raise
    return store, writer


async def _record(writer: SessionWriter, answer: Answer, call: int) -> None:
    """The answer and the call's outcome, as the agent loop records them."""
    if answer.error is not None:
        error = {"kind": answer.error.kind, "message": str(answer.error)[:_ERROR_TEXT_LIMIT]}
        await writer.append([entries.outcome(Outcome(call=call, latency_ms=answer.latency_ms,
                                                     error=error))])
        return
    assert answer.message is not None
    outcome = Outcome(call=call, stop_reason=answer.stop_reason, usage=answer.usage,
                      latency_ms=answer.latency_ms)
    await writer.append([entries.message(answer.message), entries.outcome(outcome)])


# -- output -------------------------------------------------------------------------------------


def _tool_calls(message: MessageDict | None) -> list[dict[str, Any]]:
    content = message.get("content") if message else None
    if not isinstance(content, list):
        return []
    return [{"id": b.get("id"), "name": b.get("name"), "input": b.get("input")}
            for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


def _answer_json(step: Step) -> dict[str, Any]:
    answer = step.answer
    error = None
    if answer.error is not None:
        error = {"kind": answer.error.kind, "message": str(answer.error)[:_ERROR_TEXT_LIMIT]}
    return {
        "assistant": answer.message,
        "stopReason": answer.stop_reason,
        "usage": dict(answer.usage),
        "latencyMs": round(answer.latency_ms, 3),
        "toolCalls": [t.json() for t in step.tools] or _tool_calls(answer.message),
        "toolsExecuted": any(t.source == "live" for t in step.tools),
        "error": error,
    }


def _view(replay: Replay, parts: RerunParts, provider: str, model: str,
          params: Mapping[str, Any], notes: list[str], files: Mapping[str, tuple[str, str]],
          steps: Sequence[Step], saved: Path | None) -> dict[str, Any]:
    """Everything the rerun shows, as one JSON-ready dict (the ``--json`` output): ``rerun``
    is the first answer, ``steps`` every call when tool results let the rerun go on."""
    call = replay.call(parts.call)
    recorded = replay.messages[call.assistant] if call.assistant is not None else None
    return {
        "session": replay.session_id,
        "call": parts.call,
        "provider": {"recorded": parts.provider, "rerun": provider},
        "model": {"recorded": call.model or replay.header.get("model"), "rerun": model},
        "params": dict(params),
        "messages": len(parts.messages),
        "tools": [str(t.get("name")) for t in parts.tools],
        "prompt": {
            "recorded": parts.recorded_fingerprint,
            "rerun": parts.prompt.fingerprint,
            "changed": parts.changed,
            "dropped": list(parts.dropped),
            "replaced": {name: file for name, (file, _) in files.items()},
            "recordedSections": list(parts.recorded_sections),
            "sections": [s.name for s in parts.prompt.sections],
        },
        "notes": notes,
        "recorded": {"assistant": recorded, "outcome": outcome_json(replay.outcome_of(call))},
        "rerun": _answer_json(steps[0]),
        "steps": [_answer_json(step) for step in steps],
        "saved": str(saved) if saved is not None else None,
    }


def _answer_lines(message: MessageDict | None, tool_label: str) -> list[str]:
    if message is None:
        return []
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    lines: list[str] = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if block["text"]:
                lines.append(str(block["text"]))
        elif kind == "tool_use":
            args = dumps(block.get("input")).decode()
            lines.append(f"[{tool_label}] {block.get('name')} {args}")
        else:
            lines.append(f"<{kind}>")
    return lines


def _print(view: Mapping[str, Any], out: TextIO) -> None:
    w = out.write
    prompt = view["prompt"]
    w(f"=== rerun of call {view['call']} of session {view['session']}\n")
    w(f"provider  {view['provider']['rerun']} (recorded: {view['provider']['recorded'] or '-'})\n")
    w(f"model     {view['model']['rerun']} (recorded: {view['model']['recorded'] or '-'})\n")
    w(f"params    {dumps(view['params']).decode()}\n")
    count = view["messages"]
    w(f"sent      {count} message{'' if count == 1 else 's'}; "
      f"tools: {', '.join(view['tools']) or '(none)'}\n")
    state = "changed" if prompt["changed"] else "unchanged"
    w(f"prompt    recorded {prompt['recorded'] or '(not recorded)'} -> rerun "
      f"{prompt['rerun']} ({state})\n")
    if prompt["dropped"]:
        w(f"          dropped: {', '.join(prompt['dropped'])}\n")
    for name, file in prompt["replaced"].items():
        w(f"          replaced: {name} (text from {file})\n")
    w(f"sections  {', '.join(prompt['sections']) or '(none)'}\n")
    for note in view["notes"]:
        w(f"note: {note}\n")
    recorded = view["recorded"]
    stop = (recorded["outcome"] or {}).get("stopReason")
    w(f"--- recorded answer{f' (stop {stop})' if stop else ''}\n")
    lines = _answer_lines(recorded["assistant"], "tool call")
    if not lines:
        error = (recorded["outcome"] or {}).get("error")
        lines = [f"[no answer: {error or 'not recorded'}]"]
    w("".join(f"{line}\n" for line in lines))
    for number, step in enumerate(view["steps"], start=1):
        _print_step(step, number, w)
    if view["saved"]:
        w(f"saved     {view['saved']}\n")


def _print_step(step: Mapping[str, Any], number: int, w: Any) -> None:
    which = "new answer" if number == 1 else f"new answer, call {number}"
    if step["error"] is not None:
        w(f"--- {which}: failed ({step['error']['kind']})\n{step['error']['message']}\n")
        return
    calls = step["toolCalls"]
    unrun = [c for c in calls if c.get("source", MISSING) in NOT_RUN]
    shown = "; tool calls are shown, not executed" if unrun else ""
    w(f"--- {which} (stop {step['stopReason'] or '-'}, {step['latencyMs']:.0f} ms{shown})\n")
    content = (step["assistant"] or {}).get("content")
    texts = [b for b in content if b.get("type") != "tool_use"] if isinstance(content, list) \
        else content
    w("".join(f"{line}\n" for line in _answer_lines({"content": texts}, "")))
    for call in calls:
        args = dumps(call["input"]).decode()
        source = call.get("source", MISSING)
        if source == MISSING:
            w(f"[tool call, NOT executed] {call['name']} {args}\n")
            continue
        if source == MISMATCH:
            other = call["recordedCall"]
            w(f"[tool call, NOT executed: the recorded call of {call['name']} in this round "
              f"({other['id']}) had other arguments] {call['name']} {args}\n"
              f"  recorded arguments: {dumps(other['input']).decode()}\n")
            continue
        w(f"[tool call] {call['name']} {args}\n")
        label = "error" if call["isError"] else "result"
        if call["differs"] is True:
            source += ", DIFFERS from the recorded result"
        elif call["differs"] is False:
            source += ", same as recorded"
        w(f"  {label} ({source}): {_one_line(call['result'])}\n")
        if call["differs"]:
            w(f"  recorded: {_one_line(call['recorded'])}\n")


def _one_line(content: Any, limit: int = 500) -> str:
    text = content if isinstance(content, str) else dumps(content).decode()
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
