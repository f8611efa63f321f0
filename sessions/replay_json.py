"""JSON views of a replay: one call (``--call N --json``) and a whole session (``--json``).

The whole-session shape is linear in the log's size: every message, section text and tool set
appears once, and calls point at them by index, number or fingerprint. ``docs/session-format.md``
documents it.
"""

from __future__ import annotations

from typing import Any

from sessions.endpoint import origin
from sessions.replay import Call, Outcome, PromptVersion, Replay


def outcome_json(outcome: Outcome | None) -> dict[str, Any] | None:
    if outcome is None:
        return None
    return {
        "stopReason": outcome.stop_reason,
        "usage": outcome.usage,
        "latencyMs": outcome.latency_ms,
        "error": outcome.error,
        "responseId": outcome.response_id,
        "responseModel": outcome.response_model,
        "costUsd": outcome.cost_usd,
    }


def endpoint_json(call: Call) -> str | None:
    """The endpoint the call entry records (``scheme://host:port``), or None when it records
    none (logs written before it was, in-process providers). Read through
    :func:`sessions.endpoint.origin` again, so only an origin ever comes out of a log."""
    return origin(call.endpoint)


def call_json(replay: Replay, call: Call) -> dict[str, Any]:
    """One call with everything the provider received, verbatim (null where not recorded)."""
    prompt = call.prompt
    tools = replay.tools_of(call)
    return {
        "index": call.index,
        "ts": call.ts,
        **status_json(call),
        "systemPrompt": replay.system_text(call),
        "promptFingerprint": prompt.fingerprint if prompt else None,
        "promptReason": prompt.reason if prompt else None,
        "promptNotice": call.prompt_notice,
        "messages": replay.sent(call) if call.window is not None else None,
        "assistant": replay.messages[call.assistant] if call.assistant is not None else None,
        "provider": call.provider,
        "model": call.model,
        "endpoint": endpoint_json(call),
        "params": call.params,
        "tools": list(tools) if tools is not None else None,
        "outcome": outcome_json(replay.outcome_of(call)),
    }


def status_json(call: Call) -> dict[str, Any]:
    """Whether the call rebuilds (``status``: rebuilt, not_recorded, not_rebuildable), why
    not, and what else the log says about it."""
    return {"status": call.status, "why": call.why, "notes": list(call.notes)}


def _prompt_json(version: PromptVersion) -> dict[str, Any]:
    return {
        "number": version.number,
        "line": version.line,
        "ts": version.ts,
        "fingerprint": version.fingerprint,
        "reason": version.reason,
        "sections": [{"name": s.name, "hash": s.hash} for s in version.sections],
        "verified": version.verified,
        "firstCall": version.first_call,
    }


def replay_json(replay: Replay) -> dict[str, Any]:
    """The whole replay, linear in size."""
    sections: dict[str, str | None] = {}
    for version in replay.prompts:
        for ref in version.sections:
            sections.setdefault(ref.hash, ref.text)
    messages = []
    for i in range(len(replay.messages)):
        entry = replay.messages.entry(i)
        messages.append({"index": i, "seq": entry.get("seq"), "ts": entry.get("ts"),
                         "message": entry["message"]})
    return {
        "session": dict(replay.header),
        "version": replay.version,
        "notice": replay.notice,
        "tornTail": replay.torn_tail,
        "problems": [{"line": p.line, "message": p.message} for p in replay.problems],
        "gaps": [{"line": g.line, "kind": g.kind, "at": g.at, "refused": list(g.refused)}
                 for g in replay.gaps],
        "refusals": [{"line": r.line, "ts": r.ts, "limit": r.limit, "until": r.until,
                      "afterMessages": r.after} for r in replay.refusals],
        "replies": [{"line": r.line, "ts": r.ts, "kind": r.kind, "message": r.message,
                     "text": r.text} for r in replay.replies],
        "deliveries": [{"line": d.line, "ts": d.ts, "message": d.message, "part": d.part,
                        "ref": dict(d.ref)} for d in replay.deliveries],
        "messages": messages,
        "sections": sections,
        "prompts": [_prompt_json(v) for v in replay.prompts],
        "toolSets": {fp: list(tools) for fp, tools in replay.tool_sets.items()},
        "calls": [
            {
                "index": t.index,
                "ts": t.ts,
                **status_json(t),
                "prompt": t.prompt.number if t.prompt else None,
                "promptNotice": t.prompt_notice,
                "window": [list(r) for r in t.window] if t.window is not None else None,
                "injected": [{"position": i.position, "message": i.message} for i in t.injected],
                "assistant": t.assistant,
                "call": t.entry_number,
                "inbound": t.inbound,
                "provider": t.provider,
                "model": t.model,
                "endpoint": endpoint_json(t),
                "params": t.params,
                "tools": t.tools_fingerprint,
                "outcome": outcome_json(replay.outcome_of(t)),
            }
            for t in replay.calls
        ],
    }
