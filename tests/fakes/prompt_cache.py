"""Prompt caching as the real APIs count it, for the fake provider servers.

**Anthropic** (``cache_control`` breakpoints): the request is a sequence of blocks in cache
order (tools, then system blocks, then each message's content blocks). A breakpoint on block
``b`` makes the prefix ``[0, b]`` cacheable when it holds at least ``min_tokens`` tokens. A
request reads the longest cached prefix that ends at a breakpoint or at one of the 20 blocks
before a breakpoint (the API's automatic look-back), writes everything from there to its last
breakpoint, and counts the rest as plain input: ``input_tokens + cache_creation_input_tokens +
cache_read_input_tokens`` is the whole prompt. More than four breakpoints is a 400, as from the
API. Prefixes are identified by their content without the ``cache_control`` markers (moving a
marker does not change what is cached), per model.

**OpenAI** (automatic): a prompt of at least 1024 tokens reads the longest prefix of whole
messages (tools first) seen before, in 128-token steps; ``cached_tokens`` is part of
``prompt_tokens``.

Token counts follow the fakes' rule, bytes / 4: a block's tokens are its canonical JSON's
length / 4, the whole prompt's the raw body's length / 4. Entries never expire (the real cache
keeps them 5 minutes from last use; no test runs that long).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

MAX_BREAKPOINTS = 4
LOOKBACK = 20
OPENAI_MIN = 1024
OPENAI_STEP = 128


class TooManyBreakpoints(ValueError):
    """The request marks more blocks than the API allows."""


@dataclass(frozen=True, slots=True)
class CacheUsage:
    input_tokens: int
    cache_read: int
    cache_write: int


def _canonical(item: Mapping[str, Any], tag: str) -> bytes:
    plain = {k: v for k, v in item.items() if k != "cache_control"}
    try:
        data = orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # a 2**70 and the like: any exact, stable text will do
        data = json.dumps(plain, sort_keys=True, default=repr).encode()
    return tag.encode() + data


def _anthropic_blocks(body: Mapping[str, Any]) -> list[tuple[bytes, bool]]:
    """(canonical bytes, carries a breakpoint) per block, in cache order. Whatever is not an
    object is left out: judging a malformed body is not this module's job."""
    blocks: list[tuple[bytes, bool]] = []

    def add(items: Any, tag: str) -> None:
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict):
                blocks.append((_canonical(item, tag), "cache_control" in item))

    add(body.get("tools"), "tool:")
    system = body.get("system")
    add([{"type": "text", "text": system}] if isinstance(system, str) else system, "system:")
    messages = body.get("messages")
    for n, message in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        add(content, f"{n}:{message.get('role')}:")
    return blocks


class PromptCache:
    """What a fake server has cached, per model. ``min_tokens``: the shortest cacheable prefix
    (1024 for Claude Sonnet and Opus models)."""

    def __init__(self, min_tokens: int = 1024) -> None:
        self.min_tokens = min_tokens
        self._anthropic: set[bytes] = set()
        self._openai: set[bytes] = set()

    @staticmethod
    def _prefixes(model: str, blocks: list[bytes]) -> tuple[list[bytes], list[int]]:
        """Running hashes and running token counts of the prefixes ``[0, i]``."""
        digest = hashlib.sha256(model.encode())
        hashes: list[bytes] = []
        tokens: list[int] = []
        total = 0
        for block in blocks:
            digest.update(hashlib.sha256(block).digest())
            hashes.append(digest.copy().digest())
            total += len(block) // 4
            tokens.append(total)
        return hashes, tokens

    @staticmethod
    def check(body: Mapping[str, Any]) -> list[int]:
        """The positions of the request's breakpoints; raises :class:`TooManyBreakpoints`."""
        marks = [i for i, (_, marked) in enumerate(_anthropic_blocks(body)) if marked]
        if len(marks) > MAX_BREAKPOINTS:
            raise TooManyBreakpoints(
                f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                f"Found {len(marks)}."
            )
        return marks

    def anthropic(self, body: Mapping[str, Any], raw: bytes) -> CacheUsage:
        """Count one (answered) Messages request and remember what it writes."""
        blocks = _anthropic_blocks(body)
        marks = self.check(body)
        whole = len(raw) // 4
        if not marks:
            return CacheUsage(whole, 0, 0)
        hashes, tokens = self._prefixes(str(body.get("model")), [b for b, _ in blocks])
        candidates = {p for b in marks for p in range(max(0, b - LOOKBACK), b + 1)}
        hits = [p for p in candidates if hashes[p] in self._anthropic]
        read = tokens[max(hits)] if hits else 0
        last = marks[-1]
        write = 0
        if tokens[last] >= self.min_tokens:
            write = tokens[last] - read
            self._anthropic.update(hashes[b] for b in marks if tokens[b] >= self.min_tokens)
        return CacheUsage(max(0, whole - read - write), read, write)

    def openai(self, body: Mapping[str, Any], raw: bytes) -> int:
        """``cached_tokens`` of one Chat Completions request; remembers its prefixes."""
        tools, messages = body.get("tools"), body.get("messages")
        items = [_canonical(t, "tool:") for t in tools if isinstance(t, dict)] if isinstance(
            tools, list) else []
        if isinstance(messages, list):
            items += [_canonical(m, f"{n}:") for n, m in enumerate(messages)
                      if isinstance(m, dict)]
        hashes, tokens = self._prefixes(str(body.get("model")), items)
        prompt = len(raw) // 4
        cached = 0
        for h, count in zip(hashes, tokens, strict=True):
            if count >= OPENAI_MIN and h in self._openai:
                cached = count
        self._openai.update(h for h, count in zip(hashes, tokens, strict=True)
                            if count >= OPENAI_MIN)
        if cached < OPENAI_MIN or prompt < OPENAI_MIN:
            return 0
        return min(cached - cached % OPENAI_STEP, prompt)
