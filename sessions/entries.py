"""Builders of log entry bodies (format v3), shared by every store backend.

A body is a plain dict; the writer adds ``seq`` and ``ts`` when it appends. See
``docs/session-format.md`` for the meaning of every field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sessions.encoding import encode_entry
from sessions.endpoint import origin
from sessions.records import CallRequest, MessageDict, Outcome, ToolSchema

FORMAT_VERSION = 3


def header(
    session_id: str,
    started_at: str,
    *,
    tenant: str,
    channel: str,
    conversation: str,
    generation: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``generation``: the session's place among its conversation's (:mod:`sessions.order`);
    every store gives one, ``None`` leaves the field out."""
    body: dict[str, Any] = {
        "type": "session",
        "version": FORMAT_VERSION,
        "id": session_id,
        "startedAt": started_at,
        "channel": channel,
        "conversation": conversation,
        "tenant": tenant,
    }
    if generation is not None:
        body["generation"] = generation
    if extra:
        for key, value in extra.items():
            body.setdefault(key, value)
    return body


def message(msg: MessageDict, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "message",
        "message": {"role": msg["role"], "content": msg["content"]},
    }
    if meta:
        body["meta"] = dict(meta)
    return body


def section(hash_: str, text: str) -> dict[str, Any]:
    return {"type": "section", "hash": hash_, "text": text}


def prompt(fingerprint: str, reason: str, sections: Sequence[tuple[str, str]]) -> dict[str, Any]:
    return {
        "type": "prompt",
        "fingerprint": fingerprint,
        "reason": reason,
        "sections": [{"name": name, "hash": h} for name, h in sections],
    }


def tools(fingerprint: str, schemas: Sequence[ToolSchema]) -> dict[str, Any]:
    return {"type": "tools", "fingerprint": fingerprint, "tools": [dict(t) for t in schemas]}


def call(index: int, request: CallRequest, tools_fp: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "call",
        "call": index,
        "prompt": request.prompt.fingerprint,
        "tools": tools_fp,
        "provider": request.provider,
        "model": request.model,
        "params": dict(request.params),
        "window": [[start, end] for start, end in request.window],
    }
    if request.injected:
        body["injected"] = [
            {"position": item.position, "message": item.message} for item in request.injected
        ]
    if request.cache is not None:
        body["cache"] = request.cache.to_json()
    body.update(request.lineage.to_json())
    endpoint = origin(request.endpoint)  # scheme, host and port: never a key, path or query
    if endpoint is not None:
        body["endpoint"] = endpoint
    if request.inbound is not None:
        body["inbound"] = request.inbound
    return body


def refusal(limit: str, until: str, *, message: int | None = None,
            text: str | None = None) -> dict[str, Any]:
    """A turn refused by a budget or rate limit (``limit``) before any provider call; the
    person was told they can continue at ``until`` (UTC ISO time). ``message``: the index of
    the message it answers; ``text``: what the person was told (a restart that finds it sends
    that, never the turn again)."""
    body: dict[str, Any] = {"type": "refusal", "limit": limit, "until": until}
    if message is not None:
        body["message"] = message
    if text is not None:
        body["text"] = text
    return body


def reply(message: int, kind: str, text: str) -> dict[str, Any]:
    """An answer that is not a model's: ``kind`` ``notice`` (every file of the message was
    refused, and this sentence is the whole answer) or ``apology`` (the turn failed). Written
    before it is sent, so a restart knows it went out (and sends it again only by editing)."""
    return {"type": "reply", "message": message, "kind": kind, "text": text}


def delivery(message: int, part: int, ref: Mapping[str, Any]) -> dict[str, Any]:
    """Where message ``part`` of the answer to message ``message`` is on the platform
    (``ref``: the channel's own plain data, e.g. Telegram's chat and message id). Written
    before the answer's text goes into that platform message, so a restart edits it instead
    of sending the answer again."""
    return {"type": "delivery", "message": message, "part": part, "ref": dict(ref)}


def outcome(result: Outcome) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "outcome", "call": result.call}
    if result.stop_reason is not None:
        body["stop_reason"] = result.stop_reason
    if result.usage:
        body["usage"] = dict(result.usage)
    if result.latency_ms is not None:
        body["latency_ms"] = round(result.latency_ms, 3)
    if result.error is not None:
        body["error"] = dict(result.error)
    if result.response_id is not None:
        body["response_id"] = result.response_id
    if result.response_model is not None:
        body["response_model"] = result.response_model
    if result.cost_usd is not None:
        body["cost_usd"] = round(result.cost_usd, 9)
    if result.answer is not None:
        body["answer"] = {"role": result.answer["role"], "content": result.answer["content"]}
    return body


def gap(kind: str, at: str, refused: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A ``gap`` entry: what an earlier append held that the writer refused, and why.

    Written at the head of the next append that is accepted, so the log says where something
    is missing instead of silently skipping it. ``refused`` summarises the refused entries
    (their type; a message's role; an outcome's call), never their contents.
    """
    return {"type": "gap", "kind": kind, "at": at, "refused": [summary(e) for e in refused]}


def summary(item: Mapping[str, Any]) -> dict[str, Any]:
    """What a ``gap`` entry says about one refused entry (no contents)."""
    kind = item.get("type")
    out: dict[str, Any] = {"type": kind}
    if kind == "message":
        msg = item.get("message")
        if isinstance(msg, Mapping):
            out["role"] = msg.get("role")
    elif kind == "outcome":
        out["call"] = item.get("call")
    return out


def encode_line(item: Mapping[str, Any], seq: int, ts: str) -> bytes:
    """One log line (without its newline): ``type``, ``seq``, ``ts`` first, then the body.

    Every backend stores exactly these bytes, so a session reads the same from any of them.
    Encoding is total (:mod:`sessions.encoding`): an entry orjson cannot encode exactly is
    written in the escaped form, never skipped.
    """
    body = dict(item)
    line: dict[str, Any] = {"type": body.pop("type"), "seq": seq, "ts": body.pop("ts", ts)}
    line.update(body)
    return encode_entry(line)
