"""The OpenTelemetry GenAI semantic conventions (1.37+) as pure functions of recorded parts.

Shared by the file export (:mod:`sessions.export`) and the live tracer of the application
shell, so a span reads the same whether it was sent live or exported from the log later.
Checked against semantic-conventions ``docs/gen-ai/gen-ai-spans.md`` and the
``gen-ai-input-messages.json`` / ``gen-ai-output-messages.json`` schemas. The provider is
``gen_ai.provider.name`` only: the deprecated ``gen_ai.system`` is not written.

Structured values (messages, system instructions, tool definitions) are JSON strings, as the
conventions allow on spans: span attributes of the OpenTelemetry SDK hold only primitives,
and every GenAI backend reads the string form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sessions.attachments import ATTACHMENT, category, ref_of
from sessions.encoding import dumps

OPERATION_CHAT = "chat"
OPERATION_AGENT = "invoke_agent"
OPERATION_TOOL = "execute_tool"
UNKNOWN_PROVIDER = "_OTHER"

CAPTURE_CONTENT_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The conventions' opt-in for prompts, messages and tool arguments on live spans."""

_REQUEST_PARAMS: Mapping[str, str] = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "stop_sequences": "gen_ai.request.stop_sequences",
    "stop": "gen_ai.request.stop_sequences",
    "seed": "gen_ai.request.seed",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}

_FINISH_REASONS: Mapping[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "stop": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_call",
    "tool_calls": "tool_call",
    "function_call": "tool_call",
    "max_tokens": "length",
    "length": "length",
    "refusal": "content_filter",
    "content_filter": "content_filter",
}


def finish_reason(stop_reason: str | None) -> str:
    """The GenAI finish reason of a recorded stop reason (unknown ones verbatim)."""
    if stop_reason is None:
        return "stop"
    return _FINISH_REASONS.get(stop_reason, stop_reason)


# -- messages ----------------------------------------------------------------------------------


def _part(block: Any) -> dict[str, Any]:
    if not isinstance(block, dict):
        return {"type": "text", "content": str(block)}
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": str(block.get("text", ""))}
    if kind == "tool_use":
        return {"type": "tool_call", "id": block.get("id"), "name": block.get("name"),
                "arguments": block.get("input")}
    if kind == "tool_result":
        part: dict[str, Any] = {"type": "tool_call_response", "id": block.get("tool_use_id"),
                                "response": _tool_response(block.get("content", ""))}
        if block.get("is_error"):
            part["is_error"] = True
        return part
    if kind == "thinking":
        return {"type": "reasoning", "content": str(block.get("thinking", ""))}
    if kind == ATTACHMENT:
        return _file_part(block)
    return {"type": str(kind), **{k: v for k, v in block.items() if k != "type"}}


_MODALITIES = {"image": "image", "audio": "audio", "pdf": "document", "text": "text"}


def _file_part(block: dict[str, Any]) -> dict[str, Any]:
    """An attachment as a GenAI ``file`` part that names its blob (``sha256:<hash>``), never
    its bytes; a voice note keeps the transcript the model read."""
    ref = ref_of(block)
    if ref is None:
        return {"type": "file", "file_id": None}
    part: dict[str, Any] = {"type": "file", "modality": _MODALITIES.get(category(
        ref.media_type), "other"), "mime_type": ref.media_type, "file_id": f"sha256:{ref.hash}",
        "name": ref.name, "size": ref.size}
    transcript = block.get("transcript")
    if isinstance(transcript, str):
        part["transcript"] = transcript
    if block.get("sent") is True:
        part["sent"] = True
    return part


def _tool_response(content: Any) -> Any:
    if isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" for b in content
    ):
        return "".join(str(b.get("text", "")) for b in content)
    if isinstance(content, list):  # text with a sent file: the file by hash, never bytes
        return [_part(b) for b in content]
    return content


def genai_messages(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One stored message as GenAI messages (tool results become a ``tool`` role message)."""
    role = str(message.get("role"))
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "parts": [{"type": "text", "content": content}]}]
    blocks = content if isinstance(content, list) else []
    results = [_part(b) for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
    others = [_part(b) for b in blocks if not (isinstance(b, dict)
                                              and b.get("type") == "tool_result")]
    out: list[dict[str, Any]] = []
    if results:
        out.append({"role": "tool", "parts": results})
    if others or not results:
        out.append({"role": role, "parts": others})
    return out


def calls_tool(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_use" for b in content
    )


def tool_definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool.get("name"),
        "description": tool.get("description", ""),
        "parameters": tool.get("input_schema", {"type": "object", "properties": {}}),
    }


def request_attributes(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``gen_ai.request.*`` for the params that have a convention (the first name wins)."""
    attrs: dict[str, Any] = {}
    for key, value in (params or {}).items():
        name = _REQUEST_PARAMS.get(key)
        if name is not None and value is not None:
            attrs.setdefault(name, [value] if name.endswith("stop_sequences")
                             and isinstance(value, str) else value)
    return attrs


def usage_attributes(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """``gen_ai.usage.input_tokens`` / ``output_tokens`` when recorded."""
    return {f"gen_ai.usage.{key}": usage[key] for key in ("input_tokens", "output_tokens")
            if usage and isinstance(usage.get(key), int)}


def output_messages(answer: Mapping[str, Any], reason: str) -> list[dict[str, Any]]:
    """The answer as the one output message, with its finish reason."""
    parts = [p for m in genai_messages(answer) for p in m["parts"]]
    return [{"role": "assistant", "parts": parts, "finish_reason": reason}]


def answer_reason(answer: Mapping[str, Any], stop_reason: str | None) -> str:
    """The finish reason of an answer: its stop reason mapped, else inferred from it."""
    if stop_reason is not None:
        return finish_reason(stop_reason)
    return "tool_call" if calls_tool(answer) else "stop"


def system_instructions(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "content": text}]


def as_json(value: Any) -> str:
    """A structured attribute in its JSON-string form."""
    return dumps(value).decode()


def tool_definitions(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [tool_definition(t) for t in tools]


# -- how much content a span carries -----------------------------------------------------------

CONTENT_LEVELS = ("none", "metadata", "full")
"""What of the conversation a span (live or exported) carries: ``full``, every prompt,
message, tool definition, argument and result; ``metadata``, the tool definitions (the
operator's) and the messages' shape (roles, part types, tool names and ids, file types and
sizes) without anything a person, the persona or the model wrote; ``none``, nothing of it."""

_KEPT = {"tool_call": ("type", "id", "name"), "tool_call_response": ("type", "id", "is_error"),
         "file": ("type", "modality", "mime_type", "size")}


def metadata_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """GenAI messages with their content taken out (see :data:`CONTENT_LEVELS`)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        parts = [{k: part[k] for k in _KEPT.get(str(part.get("type")), ("type",)) if k in part}
                 for part in message.get("parts", ())]
        out.append({**{k: v for k, v in message.items() if k != "parts"}, "parts": parts})
    return out


def call_content(level: str, system: str | None, sent: Sequence[Mapping[str, Any]] | None,
                 tools: Sequence[Mapping[str, Any]] | None,
                 answer: tuple[Mapping[str, Any], str] | None) -> dict[str, Any]:
    """The content attributes of a chat span at ``level``: the system instructions, the
    messages sent (stored form), the tool definitions and the answer with its finish reason;
    each when known."""
    if level not in ("metadata", "full"):
        return {}
    full = level == "full"
    attrs: dict[str, Any] = {}
    if full and system is not None:
        attrs["gen_ai.system_instructions"] = as_json(system_instructions(system))
    if sent is not None:
        inputs = [m for message in sent for m in genai_messages(message)]
        attrs["gen_ai.input.messages"] = as_json(inputs if full else metadata_messages(inputs))
    if answer is not None:
        outputs = output_messages(*answer)
        attrs["gen_ai.output.messages"] = as_json(outputs if full
                                                  else metadata_messages(outputs))
    if tools:
        attrs["gen_ai.tool.definitions"] = as_json(tool_definitions(tools))
    return attrs
