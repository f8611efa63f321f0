"""Local fake Anthropic / OpenAI HTTP servers for tests.

The fakes speak the real wire protocols (JSON and SSE) so tests can drive the
official `anthropic` and `openai` SDKs against them via `base_url`, with no
network beyond 127.0.0.1:

    async with FakeProviderServer() as srv:
        srv.script("anthropic", Reply.tool_use("get_time", {"tz": "UTC"}), Reply.text("done"))
        client = anthropic.AsyncAnthropic(api_key="test", base_url=srv.anthropic_base_url)
        ...
        assert srv.requests[0].body["system"] == "You are a bot."

Every request body is validated against the official SDKs' own request types
(:mod:`tests.fakes.request_schemas`) and answered 400, like the real API, when it breaks them.

Everything the fake emits is deterministic (ids are per-server counters, token
counts are derived from sizes, `created` is a constant) so recorded provider
traffic can be compared byte for byte across runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

from aiohttp import web

# Exact for any value a tool input can hold (a 2**70 goes out as all its digits, as a real
# API's JSON would carry it); orjson's bytes otherwise.
from sessions.encoding import dumps as json_bytes
from tests.fakes.prompt_cache import PromptCache, TooManyBreakpoints
from tests.fakes.request_schemas import violations

ApiName = Literal["anthropic", "openai"]
ReplyKind = Literal["text", "tool_use", "error", "hang", "cut_stream", "raw_stream"]

# A fixed `created` timestamp keeps OpenAI payloads reproducible across runs.
OPENAI_CREATED = 1_700_000_000
FOREVER = 3600.0
"""A hang longer than any test (``Reply.hang(FOREVER)``): only the client's timeout, or the
server closing at the end of the test, ends it. A test that gets its timeout error then knows
the client gave up, without timing anything."""
_SYSTEM_FINGERPRINT = "fp_fake"
# Size of the pieces tool-call JSON is streamed in; small so even tiny inputs
# arrive as several partial deltas, as they do from the real APIs.
_JSON_PIECE = 8

# Anthropic stop_reason -> OpenAI finish_reason.
_FINISH_REASON = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}

_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

# OpenAI (type, code) per status, as the real API reports them.
_OPENAI_ERRORS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", None),
}

# aiohttp only knows reason phrases for IANA statuses; 529 is Anthropic's own.
_REASONS = {529: "Overloaded"}


@dataclass(frozen=True)
class Transcription:
    """One upload to the audio transcription endpoint."""

    model: str
    filename: str
    content_type: str
    data: bytes
    response_format: str


@dataclass(frozen=True)
class ToolCall:
    """One tool call the fake model makes."""

    name: str
    input: Mapping[str, Any]
    id: str | None = None  # None: the server assigns toolu_... / call_...


@dataclass(frozen=True)
class Reply:
    """One scripted answer. Build it with the classmethods, not the constructor."""

    kind: ReplyKind
    content: str = ""  # answer text; for tool_use the text before the calls
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str | None = None  # Anthropic vocabulary; mapped for OpenAI
    status: int = 200
    body: Mapping[str, Any] | str | bytes | None = None  # error body; None = API's own shape
    headers: Mapping[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    after_chunks: int = 0
    then: Reply | None = None  # what hang / cut_stream deliver; None = server.default
    pieces: tuple[bytes, ...] = ()  # raw_stream: the body, one write per piece
    pace: float = 0.0  # text, streamed: seconds between events (a model writing slowly)

    @classmethod
    def text(cls, text: str, *, stop_reason: str = "end_turn", pace: float = 0.0) -> Reply:
        """A plain text answer; stop_reason e.g. "max_tokens" to fake truncation; ``pace``:
        when streamed, that many seconds between events (one word each)."""
        return cls(kind="text", content=text, stop_reason=stop_reason, pace=pace)

    @classmethod
    def tool_use(
        cls,
        name: str,
        input: Mapping[str, Any],
        id: str | None = None,
        text_before: str | None = None,
    ) -> Reply:
        """A single tool call, optionally preceded by some text."""
        return cls.tool_uses(ToolCall(name, input, id), text_before=text_before)

    @classmethod
    def tool_uses(cls, *calls: ToolCall, text_before: str | None = None) -> Reply:
        """Several tool calls in one assistant turn (parallel tool use)."""
        if not calls:
            raise ValueError("tool_uses needs at least one ToolCall")
        return cls(
            kind="tool_use", content=text_before or "", tool_calls=calls, stop_reason="tool_use"
        )

    @classmethod
    def error(
        cls,
        status: int,
        body: Mapping[str, Any] | str | bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """An HTTP error. body=None renders the API's own error JSON for that status;
        a str/bytes body is sent verbatim (e.g. an HTML page from a proxy)."""
        return cls(kind="error", status=status, body=body, headers=dict(headers or {}))

    @classmethod
    def hang(cls, seconds: float, then: Reply | None = None) -> Reply:
        """Sleep before answering (with `then`, or the default), to exercise timeouts."""
        return cls(kind="hang", seconds=seconds, then=then)

    @classmethod
    def cut_stream(cls, after_chunks: int = 1, then: Reply | None = None) -> Reply:
        """Send `after_chunks` SSE events of `then` (or the default reply), then drop the
        connection without the terminating events. On a non-streamed request, half of
        the JSON body is sent under a full Content-Length instead."""
        return cls(kind="cut_stream", after_chunks=after_chunks, then=then)


    @classmethod
    def raw_stream(cls, *pieces: bytes) -> Reply:
        """A 200 event stream of exactly these bytes, one write each (an error event in the
        middle of an answer, comments, CRLF line ends), to whatever the request asked."""
        return cls(kind="raw_stream", pieces=pieces)


# Chooses the answer when the script for an api is empty.
DefaultReply = Callable[[ApiName, dict[str, Any]], Reply]


@dataclass
class RecordedRequest:
    """One request as the fake received it."""

    api: ApiName
    path: str
    headers: dict[str, str]  # keys lower-cased; a repeated header keeps its last value
    body: dict[str, Any]  # parsed exactly; {} when the body was not a JSON object
    raw: bytes

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def last_user_text(body: Mapping[str, Any]) -> str:
    """Text of the last user message; both APIs share the messages/role/content shape."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _content_text(message.get("content"))
    return ""


def system_text(body: Mapping[str, Any]) -> str:
    """The system prompt of a request body as the model reads it: OpenAI's first system
    message, or Anthropic's ``system``, given as a string or (with a cache breakpoint) as
    text blocks, read one after the other."""
    system = body.get("system")
    if system is None:
        messages = body.get("messages") or []
        first = messages[0] if messages else {}
        return str(first.get("content", "")) if first.get("role") == "system" else ""
    if isinstance(system, str):
        return system
    return "".join(str(b.get("text", "")) for b in system if isinstance(b, dict))


def content_text(content: Any) -> str:
    """The text of a message's content, a string or blocks (tool results included)."""
    return _content_text(content)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_result":  # Anthropic tool results live in user turns
            parts.append(_content_text(block.get("content")))
    return " ".join(parts)


def echo_reply(api: ApiName, body: dict[str, Any]) -> Reply:
    """The default answer: "echo: <last user text>"."""
    return Reply.text(f"echo: {last_user_text(body)}")


@dataclass
class _Turn:
    """A text/tool_use reply resolved for one request: ids assigned, usage counted."""

    id: str
    model: str
    text: str
    tool_calls: list[tuple[str, str, Mapping[str, Any]]]  # (id, name, input)
    stop_reason: str
    input_tokens: int  # Anthropic: uncached input; OpenAI: the whole prompt
    output_tokens: int
    cache_read: int = 0
    cache_write: int = 0


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _sse(event: str | None, data: Mapping[str, Any]) -> bytes:
    # Anthropic names every event (the SDK skips events without `event:`); OpenAI names none.
    prefix = f"event: {event}\n".encode() if event else b""
    return prefix + b"data: " + json_bytes(data) + b"\n\n"


def _words(text: str) -> list[str]:
    # Whitespace stays attached to the preceding word, so "".join() restores the text.
    return re.findall(r"\s*\S+\s*|\s+", text)


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


class FakeProviderServer:
    """aiohttp server on 127.0.0.1 speaking Anthropic Messages and OpenAI Chat Completions,
    and listing models (``GET /v1/models``, what the gateway's start-up check asks).

    With ``api_key`` set, every request must carry it as the API expects it (Anthropic's
    ``x-api-key`` or a bearer token, OpenAI's ``Authorization: Bearer``), or it is answered
    401 with the API's own error body and words; without, any key is taken."""

    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key
        self.model_listings: list[tuple[ApiName, int]] = []
        """Each ``GET /v1/models``: which API's auth it carried and the status answered (kept
        apart from :attr:`requests`, which holds the calls that carry messages)."""
        self.requests: list[RecordedRequest] = []
        self.transcriptions: list[Transcription] = []
        self.transcript: str | None = None
        """What ``/v1/audio/transcriptions`` answers; None: a sentence naming the upload."""
        self.refused: list[tuple[int, list[str]]] = []
        """Requests answered 400 for breaking the API's request schema: (index, problems)."""
        self.validate = True
        """Check every body against the SDK's request types (tests of bad bodies turn it off)."""
        self.default: DefaultReply = echo_reply
        self.cache = PromptCache()
        """Prompt caching as the APIs count it (see tests/fakes/prompt_cache.py)."""
        self.port = 0
        self._queues: dict[ApiName, deque[Reply]] = {"anthropic": deque(), "openai": deque()}
        self._counters: dict[str, Iterator[int]] = {}
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        # Real APIs take bodies of tens of MB (base64 images and PDFs); aiohttp's default is 1.
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._handle_anthropic)
        app.router.add_post("/v1/chat/completions", self._handle_openai)
        app.router.add_post("/v1/audio/transcriptions", self._handle_transcription)
        app.router.add_get("/v1/models", self._handle_models)
        # handler_cancellation: a client that gives up (timeout) cancels a hanging
        # handler instead of leaving it to hold up shutdown.
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        # Port 0 lets the OS pick a free port; read back the one actually bound.
        self.port = int(self._runner.addresses[0][1])
        self._closing = asyncio.Event()

    async def close(self) -> None:
        self._closing.set()  # wake hanging handlers so shutdown is prompt
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def anthropic_base_url(self) -> str:
        return self.base_url

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    # -- scripting -----------------------------------------------------------------

    def script(self, api: ApiName, *replies: Reply) -> None:
        """Queue replies for `api`, answered in order, one per request."""
        self._queues[api].extend(replies)

    def pending(self, api: ApiName) -> int:
        """How many scripted replies for `api` have not been used yet."""
        return len(self._queues[api])

    def requests_for(self, api: ApiName) -> list[RecordedRequest]:
        return [r for r in self.requests if r.api == api]

    # -- request handling ----------------------------------------------------------

    def _next_id(self, prefix: str) -> str:
        counter = self._counters.setdefault(prefix, itertools.count(1))
        return f"{prefix}{next(counter):06d}"

    def _request_id(self, api: ApiName) -> dict[str, str]:
        # Each API reports its request id under its own header; the SDKs expose it.
        name = "request-id" if api == "anthropic" else "x-request-id"
        return {name: self._next_id("req_fake")}

    async def _handle_transcription(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's ``POST /v1/audio/transcriptions``: multipart with ``file`` and ``model``."""
        refused = self._refused_key(request, "openai")
        if refused is not None:
            return refused
        if not request.content_type.startswith("multipart/"):
            return self._error("openai", Reply.error(400, self._error_body(
                "openai", 400, "expected multipart/form-data")))
        form = await request.post()
        upload, model = form.get("file"), form.get("model")
        if not isinstance(upload, web.FileField) or not isinstance(model, str) or not model:
            return self._error("openai", Reply.error(400, self._error_body(
                "openai", 400, "file and model are required")))
        data = upload.file.read()
        self.transcriptions.append(Transcription(model, upload.filename, upload.content_type,
                                                 data, str(form.get("response_format", ""))))
        text = self.transcript if self.transcript is not None else (
            f"transcribed {upload.filename} ({len(data)} bytes) with {model}")
        return web.json_response({"text": text}, headers=self._request_id("openai"))

    async def _handle_anthropic(self, request: web.Request) -> web.StreamResponse:
        return self._refused_key(request, "anthropic") or await self._handle(request, "anthropic")

    async def _handle_openai(self, request: web.Request) -> web.StreamResponse:
        return self._refused_key(request, "openai") or await self._handle(request, "openai")

    @staticmethod
    def _api_of(request: web.Request) -> ApiName:
        """Which SDK sent it: Anthropic's carries ``anthropic-version`` (and ``x-api-key``)."""
        return "anthropic" if "anthropic-version" in request.headers else "openai"

    def _refused_key(self, request: web.Request, api: ApiName) -> web.Response | None:
        """401 as the API answers a missing or wrong key, when :attr:`api_key` is set."""
        if self.api_key is None:
            return None
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        # Anthropic takes the key as x-api-key or (as its newer SDKs send it) a bearer token.
        given = request.headers.get("x-api-key") or bearer if api == "anthropic" else bearer
        if given == self.api_key:
            return None
        # The APIs' own words: Anthropic names the header, OpenAI quotes a masked key.
        message = ("invalid x-api-key" if api == "anthropic" else
                   f"Incorrect API key provided: {_masked(given or '')}. You can find your API "
                   "key at https://platform.openai.com/account/api-keys.")
        return self._error(api, Reply.error(401, self._error_body(api, 401, message)))

    async def _handle_models(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/models``: the first page of models, in each API's shape."""
        api = self._api_of(request)
        refused = self._refused_key(request, api)
        self.model_listings.append((api, refused.status if refused is not None else 200))
        if refused is not None:
            return refused
        if api == "anthropic":
            data = [{"type": "model", "id": "claude-sonnet-4-5",
                     "display_name": "Claude Sonnet 4.5", "created_at": "2025-09-29T00:00:00Z"}]
            body: dict[str, Any] = {"data": data, "has_more": False,
                                    "first_id": data[0]["id"], "last_id": data[0]["id"]}
        else:
            body = {"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model",
                                                "created": 1721172741, "owned_by": "system"}]}
        return web.json_response(body, headers=self._request_id(api))

    async def _handle(self, request: web.Request, api: ApiName) -> web.StreamResponse:
        raw = await request.read()
        try:
            # Python's parser keeps integers past 64 bits exact (orjson would read a float);
            # NaN and Infinity are not JSON, as the real APIs say.
            parsed = json.loads(raw, parse_constant=_not_json)
        except ValueError:
            parsed = None
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append(RecordedRequest(api, request.path, headers, body, raw))
        if not isinstance(parsed, dict):
            return self._error(
                api, Reply.error(400, self._error_body(api, 400, "body is not a JSON object"))
            )
        problems = violations(api, body) if self.validate else []
        if problems:  # what the real API refuses, it refuses here: 400, the first problem named
            self.refused.append((len(self.requests) - 1, problems))
            return self._error(api, Reply.error(400, self._error_body(api, 400, problems[0])))
        if api == "anthropic":
            try:
                self.cache.check(body)
            except TooManyBreakpoints as exc:
                return self._error(api, Reply.error(400, self._error_body(api, 400, str(exc))))
        queue = self._queues[api]
        reply = queue.popleft() if queue else self.default(api, body)
        return await self._respond(request, api, body, raw, reply, cut_after=None)

    async def _respond(
        self,
        request: web.Request,
        api: ApiName,
        body: dict[str, Any],
        raw: bytes,
        reply: Reply,
        cut_after: int | None,
    ) -> web.StreamResponse:
        if reply.kind == "error":
            return self._error(api, reply)
        if reply.kind == "raw_stream":
            return await self._send_stream(request, self._request_id(api), list(reply.pieces),
                                           cut_after)
        if reply.kind in ("hang", "cut_stream"):
            if reply.kind == "hang":
                await self._sleep(reply.seconds)
            else:
                cut_after = reply.after_chunks
            inner = reply.then or self.default(api, body)
            return await self._respond(request, api, body, raw, inner, cut_after)

        turn = self._turn(api, body, raw, reply)
        headers = self._request_id(api)
        if body.get("stream"):
            events = (
                self._anthropic_events(turn)
                if api == "anthropic"
                else self._openai_chunks(turn, body)
            )
            return await self._send_stream(request, headers, events, cut_after, reply.pace)
        payload = (
            self._anthropic_message(turn) if api == "anthropic" else self._openai_completion(turn)
        )
        data = json_bytes(payload)
        if cut_after is not None:
            return await self._send_truncated(request, headers, data)
        return web.Response(body=data, content_type="application/json", headers=headers)

    async def _sleep(self, seconds: float) -> None:
        # Ends early when the server closes, so a hang never holds up teardown.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), timeout=seconds)

    def _turn(self, api: ApiName, body: dict[str, Any], raw: bytes, reply: Reply) -> _Turn:
        if reply.kind not in ("text", "tool_use"):
            raise ValueError(f"not an answer reply: {reply.kind}")
        anthropic = api == "anthropic"
        calls = [
            (c.id or self._next_id("toolu_fake" if anthropic else "call_fake"), c.name, c.input)
            for c in reply.tool_calls
        ]
        produced = reply.content + "".join(json_bytes(dict(i)).decode() for _, _, i in calls)
        # Only an answered request reads and writes the prompt cache, as with the real APIs.
        if anthropic:
            cached = self.cache.anthropic(body, raw)
            input_tokens, read, write = cached.input_tokens, cached.cache_read, cached.cache_write
        else:
            input_tokens, read, write = len(raw) // 4, self.cache.openai(body, raw), 0
        return _Turn(
            id=self._next_id("msg_fake" if anthropic else "chatcmpl-fake"),
            model=str(body.get("model", "fake-model")),
            text=reply.content,
            tool_calls=calls,
            stop_reason=reply.stop_reason or "end_turn",
            input_tokens=input_tokens,
            output_tokens=len(produced) // 4 + 1,
            cache_read=read,
            cache_write=write,
        )

    # -- Anthropic Messages ----------------------------------------------------------

    @staticmethod
    def _anthropic_usage(turn: _Turn, output_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": turn.input_tokens,
            "cache_creation_input_tokens": turn.cache_write,
            "cache_read_input_tokens": turn.cache_read,
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }

    @staticmethod
    def _anthropic_blocks(turn: _Turn) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if turn.text or not turn.tool_calls:
            blocks.append({"type": "text", "text": turn.text})
        for call_id, name, args in turn.tool_calls:
            blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": dict(args)})
        return blocks

    def _anthropic_message(self, turn: _Turn) -> dict[str, Any]:
        return {
            "id": turn.id,
            "type": "message",
            "role": "assistant",
            "model": turn.model,
            "content": self._anthropic_blocks(turn),
            "stop_reason": turn.stop_reason,
            "stop_sequence": None,
            "usage": self._anthropic_usage(turn, turn.output_tokens),
        }

    def _anthropic_events(self, turn: _Turn) -> list[bytes]:
        start = self._anthropic_message(turn) | {
            "content": [],
            "stop_reason": None,
            "usage": self._anthropic_usage(turn, 1),
        }
        events = [_sse("message_start", {"type": "message_start", "message": start})]
        for index, block in enumerate(self._anthropic_blocks(turn)):
            deltas: list[dict[str, Any]]
            if block["type"] == "text":
                opening = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": w} for w in _words(block["text"])]
            else:
                opening = block | {"input": {}}
                # The real API opens every tool input with an empty partial_json.
                pieces = ["", *_pieces(json_bytes(block["input"]).decode(), _JSON_PIECE)]
                deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
            events.append(
                _sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": opening},
                )
            )
            if index == 0:  # the real API sends a keep-alive ping early on; SDKs skip it
                events.append(_sse("ping", {"type": "ping"}))
            for delta in deltas:
                events.append(
                    _sse(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": delta},
                    )
                )
            events.append(
                _sse("content_block_stop", {"type": "content_block_stop", "index": index})
            )
        events.append(
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": turn.stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": turn.output_tokens},
                },
            )
        )
        events.append(_sse("message_stop", {"type": "message_stop"}))
        return events

    # -- OpenAI Chat Completions -----------------------------------------------------

    @staticmethod
    def _openai_usage(turn: _Turn) -> dict[str, Any]:
        return {
            "prompt_tokens": turn.input_tokens,
            "completion_tokens": turn.output_tokens,
            "total_tokens": turn.input_tokens + turn.output_tokens,
            "prompt_tokens_details": {"cached_tokens": turn.cache_read, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    @staticmethod
    def _openai_envelope(turn: _Turn, obj: str) -> dict[str, Any]:
        return {
            "id": turn.id,
            "object": obj,
            "created": OPENAI_CREATED,
            "model": turn.model,
            "service_tier": "default",
            "system_fingerprint": _SYSTEM_FINGERPRINT,
        }

    @staticmethod
    def _finish_reason(turn: _Turn) -> str:
        return _FINISH_REASON.get(turn.stop_reason, "stop")

    def _openai_completion(self, turn: _Turn) -> dict[str, Any]:
        message: dict[str, Any] = {
            # Like the real API: content is null on a tool-call-only turn.
            "role": "assistant",
            "content": turn.text if turn.text or not turn.tool_calls else None,
            "refusal": None,
            "annotations": [],
        }
        if turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json_bytes(dict(args)).decode()},
                }
                for call_id, name, args in turn.tool_calls
            ]
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": self._finish_reason(turn),
        }
        return self._openai_envelope(turn, "chat.completion") | {
            "choices": [choice],
            "usage": self._openai_usage(turn),
        }

    def _openai_chunks(self, turn: _Turn, body: dict[str, Any]) -> list[bytes]:
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        envelope = self._openai_envelope(turn, "chat.completion.chunk")
        if include_usage:  # the real API then carries "usage": null on every chunk
            envelope["usage"] = None

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return _sse(None, envelope | {"choices": [choice]})

        content = "" if turn.text or not turn.tool_calls else None
        chunks = [chunk({"role": "assistant", "content": content, "refusal": None})]
        chunks += [chunk({"content": w}) for w in _words(turn.text)]
        for index, (call_id, name, args) in enumerate(turn.tool_calls):
            opening = {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            chunks.append(chunk({"tool_calls": [opening]}))
            for piece in _pieces(json_bytes(dict(args)).decode(), _JSON_PIECE):
                part = {"index": index, "function": {"arguments": piece}}
                chunks.append(chunk({"tool_calls": [part]}))
        chunks.append(chunk({}, self._finish_reason(turn)))
        if include_usage:
            chunks.append(_sse(None, envelope | {"choices": [], "usage": self._openai_usage(turn)}))
        chunks.append(b"data: [DONE]\n\n")
        return chunks

    # -- transport -------------------------------------------------------------------

    async def _send_stream(
        self,
        request: web.Request,
        headers: dict[str, str],
        events: list[bytes],
        cut_after: int | None,
        pace: float = 0.0,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers=headers | {"Content-Type": "text/event-stream; charset=utf-8"}
        )
        response.headers["Cache-Control"] = "no-cache"
        await response.prepare(request)
        for sent, event in enumerate(events):
            if cut_after is not None and sent >= cut_after:
                self._drop_connection(request)
                return response
            try:
                await response.write(event)
            except ConnectionResetError:
                return response  # the client went away mid-stream (killed): nothing to send
            if pace:
                await self._sleep(pace)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()  # the client may have gone after the last event
        return response

    async def _send_truncated(
        self, request: web.Request, headers: dict[str, str], data: bytes
    ) -> web.StreamResponse:
        # Promise the whole body, deliver half: the client sees a premature EOF.
        response = web.StreamResponse(headers=headers | {"Content-Type": "application/json"})
        response.content_length = len(data)
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        self._drop_connection(request)
        return response

    @staticmethod
    def _drop_connection(request: web.Request) -> None:
        # close() (not abort()) so the events already written are flushed first. The
        # chunked terminator is never sent; aiohttp ignores the failed write_eof after.
        if request.transport is not None:
            request.transport.close()

    def _error(self, api: ApiName, reply: Reply) -> web.Response:
        headers = self._request_id(api)
        body = reply.body
        if body is None:
            body = self._error_body(api, reply.status, None)
        if isinstance(body, Mapping):
            data, content_type = json_bytes(dict(body)), "application/json"
        else:
            data = body.encode() if isinstance(body, str) else body
            content_type = "text/plain; charset=utf-8"
        headers = {"Content-Type": content_type} | headers | dict(reply.headers)
        return web.Response(
            status=reply.status, reason=_REASONS.get(reply.status), body=data, headers=headers
        )

    @staticmethod
    def _error_body(api: ApiName, status: int, message: str | None) -> dict[str, Any]:
        if api == "anthropic":
            kind = _ANTHROPIC_ERROR_TYPES.get(
                status, "api_error" if status >= 500 else "invalid_request_error"
            )
            text = message or ("Overloaded" if status == 529 else f"fake {kind} (HTTP {status})")
            return {"type": "error", "error": {"type": kind, "message": text}}
        kind, code = _OPENAI_ERRORS.get(
            status, ("server_error" if status >= 500 else "invalid_request_error", None)
        )
        text = message or f"fake {kind} (HTTP {status})"
        return {"error": {"message": text, "type": kind, "param": None, "code": code}}


def _masked(key: str) -> str:
    """A key as OpenAI's 401 shows it: the first three and last four characters."""
    return f"{key[:3]}{'*' * max(len(key) - 7, 0)}{key[-4:]}" if len(key) > 7 else "*" * len(key)
