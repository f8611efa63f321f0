"""A deterministic provider that needs no network and no API key: the default without one.

It still drives the agent loop for real: a few phrasings of the last user message turn into
persona tool calls, "remind me in 2 minutes to stretch" (or "remind me to call the bank
tomorrow at 9", "remind me every 2 hours to drink water") into a ``schedule_create`` call, and
"what time is it" into a call of the example MCP clock server's ``clock__now`` (only for
tools the request offers, and only when their schema's required fields can be filled), tool
results are acknowledged in text, a scheduled turn (``scheduled: <id> <instruction>``) is
answered with the reminder, and anything else gets a reply that quotes the user and names the
persona from the system prompt, so a broken prompt or window shows up even offline. Same
request in, same answer out: no clocks, no randomness (the time is read by the tool, not
here).

It reads the messages as an Anthropic-shaped body would carry them (attachments expanded from
the request's blobs, as a real provider would be sent them), says which images and documents
it got, and quotes transcripts and text files as text. :class:`OfflineTranscriber` is its
deterministic stand-in for speech to text, so voice notes work in ``make run``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, Self

import orjson

from gateway.edge.provider import ProviderRequest, ProviderResponse, TextSink
from sessions.attachments import has_refs, human_size
from sessions.records import MessageDict, ToolSchema
from sessions.shapes import Shape, anthropic_body

_WORDS_PER_CHUNK = 3
_PERSONA = re.compile(r"^\s*(?:you are|i am)\s+([^,.;:\n]+)", re.IGNORECASE)
_SPEAKER = re.compile(r"^\[[^\[\]\n]*\]\s*")

# (tool name, text before the call, input) for a user text, or None when the rule does not apply.
_Intent = tuple[str, str, dict[str, str]]

# When a reminder is for, as people say it (what the schedule tool reads): "in 2 minutes",
# "in 1h 30m", "tomorrow at 9", "today 18:30", "on friday at 6pm", "at 9am", "every 2 hours".
_CLOCK_TEXT = r"\d{1,2}(?:[:.]\d{2})?\s*(?:am|pm)?"
_SPAN_TEXT = (r"\d+(?:\.\d+)?\s*(?:s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?"
              r"|w|weeks?)")
_DAY_TEXT = r"(?:today|tomorrow|monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_WHEN_TEXT = (rf"(?:in\s+{_SPAN_TEXT}(?:\s*(?:,|and)?\s*{_SPAN_TEXT})*"
              rf"|every\s+{_SPAN_TEXT}"
              rf"|(?:on\s+)?{_DAY_TEXT}(?:\s+(?:at\s+)?{_CLOCK_TEXT})?"
              rf"|at\s+{_CLOCK_TEXT})")
_REMIND = (re.compile(rf"^remind me\s+(?P<when>{_WHEN_TEXT})\s+to\s+(?P<what>.+?)[.!]*$",
                      re.IGNORECASE | re.DOTALL),
           re.compile(rf"^remind me\s+to\s+(?P<what>.+?)\s+(?P<when>{_WHEN_TEXT})[.!]*$",
                      re.IGNORECASE | re.DOTALL))
_REMINDER = "Remind them to "
"""How the instructions this provider sets start; a scheduled turn of one is answered with
the rest ("Reminder: stretch")."""
_SCHEDULED = re.compile(r"^scheduled: (\S+) (.+)$", re.DOTALL)


class OfflineProvider:
    """Rule-based stand-in for an LLM (Anthropic message shape). An async context manager."""

    name = "offline"
    shape: Shape = "anthropic"
    endpoint: str | None = None  # answers in process: no server to name

    def __init__(self, model: str = "offline-1", delay: float = 0.0) -> None:
        self.model = model
        self._delay = delay

    def params(self) -> Mapping[str, Any]:
        """Fields an Anthropic-shaped body of this provider would carry."""
        return {"max_tokens": 1024}

    async def complete(
        self, request: ProviderRequest, on_text: TextSink | None = None
    ) -> ProviderResponse:
        """Answer by rule; the text part is streamed into ``on_text`` a few words at a time."""
        if any(has_refs(m["content"]) for m in request.messages):
            # What a real provider would be sent: attachments expanded (a missing blob raises).
            body = anthropic_body(request.system, request.messages, request.tools,
                                  request.model, request.params, request.blobs)
            request = replace(request, messages=body["messages"])
        seen = orjson.dumps(list(request.messages), option=orjson.OPT_SORT_KEYS)
        digest = hashlib.sha256(request.system.encode() + seen).hexdigest()
        content: list[dict[str, Any]] = []
        stop_reason = "end_turn"
        intent = _intent(request)
        if intent is None:
            content.append({"type": "text", "text": _reply(request)})
        else:
            name, preface, args = intent
            content.append({"type": "text", "text": preface})
            tool_id = "toolu_off_" + digest[:12]
            content.append({"type": "tool_use", "id": tool_id, "name": name, "input": args})
            stop_reason = "tool_use"
        await self._stream(content[0]["text"], on_text)
        produced = orjson.dumps(content)
        return ProviderResponse(
            message={"role": "assistant", "content": content},
            stop_reason=stop_reason,
            usage={
                "input_tokens": (len(request.system) + len(seen)) // 4,
                "output_tokens": len(produced) // 4,
            },
        )

    async def _stream(self, text: str, on_text: TextSink | None) -> None:
        words = re.findall(r"\S+\s*", text)
        for start in range(0, len(words), _WORDS_PER_CHUNK):
            if on_text is not None:
                await on_text("".join(words[start : start + _WORDS_PER_CHUNK]))
            # Yield to the loop between chunks, as a network stream would.
            await asyncio.sleep(self._delay)

    async def aclose(self) -> None:
        """Nothing to release; present for the Provider contract."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _intent(request: ProviderRequest) -> _Intent | None:
    """The tool call the last user text asks for, if an offered tool can take it."""
    if not request.messages or request.messages[-1].get("role") != "user":
        return None
    # In a group the message starts with its speaker, "[Ada (1001)] remember ...": the
    # phrasings are matched on what the person wrote.
    text = _SPEAKER.sub("", _user_text(request.messages[-1]).strip(), count=1)
    schemas = _schemas(request.tools)
    for rule in _RULES:
        found = rule(text, request.system)
        if found is None:
            continue
        name, preface, wanted = found
        if name not in schemas:
            continue
        args = _fit(schemas[name], wanted)
        if args is not None:
            return name, preface, args
    return None


def _after(text: str, *prefixes: str) -> str | None:
    """The non-empty rest of ``text`` after the first matching prefix (case-insensitive)."""
    lower = text.lower()
    for prefix in prefixes:
        if lower.startswith(prefix) and text[len(prefix) :].strip():
            return text[len(prefix) :].strip()
    return None


def _remember(text: str, system: str) -> _Intent | None:
    rest = _after(text, "remember that ", "remember ")
    return None if rest is None else ("memory_write", "I'll remember that.", {"text": rest})


def _kb_note(text: str, system: str) -> _Intent | None:
    rest = _after(text, "note in kb:")
    if rest is None or ":" not in rest:
        return None
    title, body = (part.strip() for part in rest.split(":", 1))
    if not title or not body:
        return None
    return "kb_write", f"Saving a note titled {title}.", {"title": title, "text": body}


def _kb_search(text: str, system: str) -> _Intent | None:
    rest = _after(text, "search kb for ")
    return None if rest is None else ("kb_search", "Let me look that up.", {"query": rest})


def _mood(text: str, system: str) -> _Intent | None:
    rest = _after(text, "set mood to ", "mood:")
    return None if rest is None else ("mood_set", "Changing my mood.", {"mood": rest})


def _rename(text: str, system: str) -> _Intent | None:
    rest = _after(text, "call yourself ")
    if rest is None:
        return None
    new = rest.rstrip(".!")
    old = _persona(system)
    # Replace the "You are NAME" opening when there is one, otherwise append a line.
    wanted = (
        {"find": f"You are {old}", "replace": f"You are {new}"}
        if old is not None and f"You are {old}" in system
        else {"find": "", "replace": f"Your name is {new}."}
    )
    return "soul_patch", f"From now on I'm {new}.", wanted


def _remind(text: str, system: str) -> _Intent | None:
    for pattern in _REMIND:
        found = pattern.match(" ".join(text.split()))
        if found is None:
            continue
        when = found.group("when").lower()
        what = found.group("what").strip()
        instruction = {"instruction": f"{_REMINDER}{what}"}
        if when.startswith("every "):
            return "schedule_create", "Setting that up.", {**instruction, "every": when[6:]}
        return ("schedule_create", "I'll remind you.",
                {**instruction, "when": when.removeprefix("on ")})
    return None


def _time(text: str, system: str) -> _Intent | None:
    # The example MCP clock server's tool (mcp.example.json); absent unless it is configured.
    wanted = "what time is it" in text.lower() or "what's the time" in text.lower()
    return ("clock__now", "Let me check the clock.", {}) if wanted else None


_RULES: tuple[Callable[[str, str], _Intent | None], ...] = (
    _time,
    _remind,
    _remember,
    _kb_note,
    _kb_search,
    _mood,
    _rename,
)


def _fit(schema: Mapping[str, Any], wanted: dict[str, str]) -> dict[str, str] | None:
    """``wanted`` cut down to the schema's properties; None if a required field is missing."""
    required = schema.get("required", [])
    if any(field not in wanted for field in required):
        return None
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return wanted
    args = {k: v for k, v in wanted.items() if k in properties}
    return args if args or not wanted else None


def _schemas(tools: Sequence[ToolSchema]) -> dict[str, Mapping[str, Any]]:
    return {str(t["name"]): t.get("input_schema", {}) for t in tools}


def _reply(request: ProviderRequest) -> str:
    """A text answer: acknowledges tool results, or greets and quotes the user."""
    messages = request.messages
    last = messages[-1] if messages else None
    results = _tool_results(last) if last is not None and last.get("role") == "user" else []
    if results:
        return "Done: " + "; ".join(results)
    said = _user_text(last).strip() if last is not None and last.get("role") == "user" else ""
    scheduled = _SCHEDULED.match(_SPEAKER.sub("", said, count=1))
    if scheduled is not None:  # a reminder's time has come: say it
        ident, instruction = scheduled.groups()
        if instruction.startswith(_REMINDER):
            return f"Reminder: {instruction.removeprefix(_REMINDER)}"
        return f"Scheduled task {ident}: {instruction}"
    persona = _persona(request.system) or "your assistant"
    count = f"{len(messages)} message{'s' if len(messages) != 1 else ''}"
    media = _media_note(last) if last is not None and last.get("role") == "user" else ""
    if not said:
        return f"{persona} here (offline mode). I can see {count}.{media}"
    return f'{persona} here (offline mode). You said: "{said}". I can see {count}.{media}'


def _media_note(message: MessageDict) -> str:
    """`` It came with 1 image, 1 document (report.pdf) and a voice note (voice.ogg): "..."``
    for what a user message carried besides its text, or ``""``."""
    content = message.get("content")
    if not isinstance(content, list):
        return ""
    blocks = [b for b in content if isinstance(b, dict)]
    images = sum(1 for b in blocks if b.get("type") == "image")
    documents = [str(b.get("title", "?")) for b in blocks if b.get("type") == "document"]
    parts = []
    if images:
        parts.append(f"{images} image{'s' if images != 1 else ''}")
    if documents:
        plural = "s" if len(documents) != 1 else ""
        parts.append(f"{len(documents)} document{plural} ({', '.join(documents)})")
    for block in blocks:
        found = _EXPANDED.match(str(block.get("text", ""))) if block.get("type") == "text" else None
        if found is None:
            continue
        kind, name, body = found.groups()
        if kind == "transcript":
            heard = " ".join(body.split())
            parts.append(f'a voice note ({name}): "{heard}"')
        else:
            lines = body.count("\n") + 1
            parts.append(f"a file ({name}, {lines} line{'s' if lines != 1 else ''})")
    if not parts:
        return ""
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f" It came with {listed}."


# What sessions.attachments makes of a transcript or a text file (the offline reply names
# them rather than quoting them as something the person typed).
_EXPANDED = re.compile(r'<(transcript|file) (?:of|name)="([^"]*)"[^>]*>\n(.*)\n</\1>\Z', re.S)


class OfflineTranscriber:
    """Speech to text without a model: the same audio always gives the same sentence, which
    names the file, its size and the start of its hash (so a demo shows what was heard)."""

    model = "offline-transcriber"

    async def transcribe(self, audio: bytes, media_type: str, name: str) -> str:
        digest = hashlib.sha256(audio).hexdigest()[:8]
        return (f"(offline transcription) a voice message, {name}, {human_size(len(audio))}, "
                f"{media_type}, fingerprint {digest}.")

    async def aclose(self) -> None:
        """Nothing to release."""


def _persona(system: str) -> str | None:
    """The persona's name from the prompt's first line ("You are NAME, ...")."""
    first = system.strip().split("\n", 1)[0]
    match = _PERSONA.match(first)
    return match.group(1).strip() if match else None


def _user_text(message: MessageDict) -> str:
    """What the person typed (expanded transcripts and text files excluded)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
        and not _EXPANDED.match(str(b.get("text", "")))
    )


def _tool_results(message: MessageDict) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    results: list[str] = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "tool_result":
            continue
        text = _result_text(block.get("content", ""))
        results.append(f"error: {text}" if block.get("is_error") else text)
    return results


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return orjson.dumps(content).decode()
