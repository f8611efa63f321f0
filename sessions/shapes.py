"""Provider request bodies built from request parts: the one place a request gets its shape.

Live providers and ``gateway replay --request`` both call these functions, so a recorded call
rebuilds the same body the provider received, and both encode it with :func:`encode_body`:
providers post exactly those bytes, so "sent" and "rebuilt" are equal byte for byte. Pure and
deterministic: no I/O, no clocks, no randomness; tool-call arguments are serialised with
orjson so the same input gives the same string every time. Prompt-cache markers are a separate
step on the shaped body (:func:`sessions.caching.add_breakpoints`).

Attachment references in messages are expanded here (:mod:`sessions.attachments`) from the
``blobs`` the caller loaded (hash -> bytes): images, PDFs and text files become the shape's own
blocks. A file inside a tool result (an image an MCP tool returned) stays inside the Anthropic
``tool_result``; Chat Completions tool messages take only text, so for OpenAI it follows the
tool messages in a user message that names its tool call. Messages without attachments are
shaped exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from sessions.attachments import expand_anthropic, expand_openai, has_refs
from sessions.caching import CachePlan, add_breakpoints
from sessions.encoding import dumps
from sessions.records import MessageDict, ToolSchema

Shape = Literal["anthropic", "openai"]
SHAPES: tuple[Shape, ...] = ("anthropic", "openai")


def anthropic_body(
    system: str | None,
    messages: Sequence[MessageDict],
    tools: Sequence[ToolSchema],
    model: str,
    params: Mapping[str, Any],
    blobs: Mapping[str, bytes] | None = None,
) -> dict[str, Any]:
    """Body of ``POST /v1/messages``. Blocks are passed through as stored, attachment
    references expanded."""
    body: dict[str, Any] = {"model": model}
    body.update(params)
    if system:
        body["system"] = system
    body["messages"] = [
        {"role": m["role"], "content": expand_anthropic(m["content"], blobs or {})
         if has_refs(m["content"]) else m["content"]}
        for m in messages
    ]
    if tools:
        body["tools"] = [dict(t) for t in tools]
    return body


def openai_body(
    system: str | None,
    messages: Sequence[MessageDict],
    tools: Sequence[ToolSchema],
    model: str,
    params: Mapping[str, Any],
    blobs: Mapping[str, bytes] | None = None,
) -> dict[str, Any]:
    """Body of ``POST /v1/chat/completions`` (any OpenAI-compatible server)."""
    body: dict[str, Any] = {"model": model}
    body.update(params)
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for message in messages:
        out.extend(openai_messages(message, blobs))
    body["messages"] = out
    if tools:
        body["tools"] = [openai_tool(t) for t in tools]
    return body


def openai_tool(tool: ToolSchema) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "parameters": tool.get("input_schema", {"type": "object", "properties": {}}),
        },
    }


def openai_messages(message: MessageDict,
                    blobs: Mapping[str, bytes] | None = None) -> list[dict[str, Any]]:
    """One stored message as the OpenAI messages it becomes (tool results become ``tool`` roles;
    a user message with attachments gets a list of content parts)."""
    role = message["role"]
    content = message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    texts = [b["text"] for b in content if b.get("type") == "text"]
    if role == "assistant":
        calls = [
            {
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": dumps(b["input"]).decode()},
            }
            for b in content
            if b.get("type") == "tool_use"
        ]
        out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if calls:
            out["tool_calls"] = calls
        return [out]
    results = [b for b in content if b.get("type") == "tool_result"]
    result: list[dict[str, Any]] = [
        {
            "role": "tool",
            "tool_call_id": b["tool_use_id"],
            "content": _tool_result_text(b.get("content", "")),
        }
        for b in results
    ]
    files = _tool_result_files(results, blobs or {})
    if files:
        result.append({"role": "user", "content": files})
    if any(isinstance(b, dict) and b.get("type") == "attachment" for b in content):
        parts = expand_openai(content, blobs or {})
        if parts:
            result.append({"role": role, "content": parts})
    elif texts:
        result.append({"role": role, "content": "\n".join(texts)})
    return result


TOOL_FILES_INTRO = ("Files returned by tool call {id} (part of its result above, not a "
                    "message from the person):")
"""The text before a tool result's files in the OpenAI shape (see :func:`_tool_result_files`)."""


def _tool_result_files(results: Sequence[Mapping[str, Any]],
                       blobs: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """The files inside tool results (an MCP server's image) as user content parts.

    Chat Completions ``tool`` messages take text only, so a tool result's images and PDFs
    follow the tool messages in one user message: for each result that has some, a line
    naming its call, then the files in order (files the agent sent are never sent back).
    Empty when no result has one, so logs without such files shape exactly as before."""
    parts: list[dict[str, Any]] = []
    for block in results:
        inner = block.get("content")
        if not isinstance(inner, list):
            continue
        shown = [b for b in inner if isinstance(b, dict) and b.get("type") == "attachment"
                 and b.get("sent") is not True]
        if shown:
            parts.append({"type": "text",
                          "text": TOOL_FILES_INTRO.format(id=block["tool_use_id"])})
            parts.extend(expand_openai(shown, blobs))
    return parts


def _tool_result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return dumps(content).decode()


def request_body(
    shape: Shape,
    system: str | None,
    messages: Sequence[MessageDict],
    tools: Sequence[ToolSchema],
    model: str,
    params: Mapping[str, Any],
    *,
    cache: CachePlan | None = None,
    sections: Sequence[str] = (),
    blobs: Mapping[str, bytes] | None = None,
) -> dict[str, Any]:
    """Dispatch to the body builder of ``shape``; for Anthropic, then place the ``cache``
    plan's breakpoints (``sections``: the texts the system prompt is joined from)."""
    if shape == "anthropic":
        body = anthropic_body(system, messages, tools, model, params, blobs)
        return body if cache is None else add_breakpoints(body, cache, sections)
    if shape == "openai":
        return openai_body(system, messages, tools, model, params, blobs)
    raise ValueError(f"unknown request shape {shape!r} (choose from {', '.join(SHAPES)})")


def encode_body(body: Mapping[str, Any]) -> bytes:
    """The exact bytes of a request body as sent over HTTP (compact JSON, UTF-8; values orjson
    cannot take exactly, such as integers past 64 bits, in Python's exact notation)."""
    return dumps(body)
