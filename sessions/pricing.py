"""What a provider call costs: a price table per model, and the cost of one call's usage. Pure.

Prices are US dollars per million tokens, four of them per model: ``input`` (uncached input),
``output`` (reasoning included), ``cache_write`` (input written to the prompt cache) and
``cache_read`` (input read from it). A model name is matched to the longest table key it
starts with, so a dated version (``claude-sonnet-4-5-20250929``, ``gpt-4o-mini-2024-07-18``)
takes its family's price; a ``vendor/`` path in front is ignored.

:data:`DEFAULT_PRICES` holds the published list prices of current Anthropic and OpenAI models as
of late 2025 (Anthropic's 5-minute cache write: 1.25x input; OpenAI has no cache-write
surcharge), checked against the ``genai-prices`` package's snapshot (0.2.5, 2026-12: every model
agrees; how to repeat the check: docs/operator-tools.md, "Prices"). Prices change: an operator
overrides or extends them with a file (:func:`parse_price_file`, ``GATEWAY_PRICES_FILE``). A
model the table does not know has no cost (``None``), never a guessed one.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PER = 1_000_000
"""Prices are per this many tokens."""


class PriceFileError(ValueError):
    """A price file that cannot be read as a table; the message says where."""


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float
    output: float
    cache_write: float
    cache_read: float

    def cost(self, usage: Mapping[str, Any]) -> float:
        """The cost of one call's ``usage`` (the outcome's vocabulary)."""
        return (
            _tokens(usage, "input_tokens") * self.input
            + _tokens(usage, "output_tokens") * self.output
            + _tokens(usage, "cache_creation_input_tokens") * self.cache_write
            + _tokens(usage, "cache_read_input_tokens") * self.cache_read
        ) / PER


def _anthropic(input_: float, output: float) -> Price:
    return Price(input_, output, cache_write=input_ * 1.25, cache_read=input_ / 10)


def _openai(input_: float, output: float, cached: float) -> Price:
    return Price(input_, output, cache_write=input_, cache_read=cached)


DEFAULT_PRICES: Mapping[str, Price] = {
    # Anthropic
    "claude-opus-4-5": _anthropic(5.0, 25.0),
    "claude-opus-4": _anthropic(15.0, 75.0),  # 4 and 4.1
    "claude-sonnet-4": _anthropic(3.0, 15.0),  # 4 and 4.5
    "claude-3-7-sonnet": _anthropic(3.0, 15.0),
    "claude-haiku-4-5": _anthropic(1.0, 5.0),
    "claude-3-5-haiku": _anthropic(0.8, 4.0),
    # Anthropic lists Haiku 3's cache reads at $0.03, not a tenth of $0.25.
    "claude-3-haiku": Price(0.25, 1.25, cache_write=0.30, cache_read=0.03),
    "claude-3-opus": _anthropic(15.0, 75.0),
    # OpenAI
    "gpt-5": _openai(1.25, 10.0, 0.125),
    "gpt-5-mini": _openai(0.25, 2.0, 0.025),
    "gpt-5-nano": _openai(0.05, 0.4, 0.005),
    "gpt-4.1": _openai(2.0, 8.0, 0.5),
    "gpt-4.1-mini": _openai(0.4, 1.6, 0.1),
    "gpt-4.1-nano": _openai(0.1, 0.4, 0.025),
    "gpt-4o": _openai(2.5, 10.0, 1.25),
    "gpt-4o-mini": _openai(0.15, 0.6, 0.075),
    "gpt-5-pro": _openai(15.0, 120.0, 15.0),
    "o1": _openai(15.0, 60.0, 7.5),
    "o1-mini": _openai(1.1, 4.4, 0.55),
    "o1-pro": _openai(150.0, 600.0, 150.0),
    "o3": _openai(2.0, 8.0, 0.5),
    "o3-mini": _openai(1.1, 4.4, 0.55),
    "o3-pro": _openai(20.0, 80.0, 20.0),
    "o4-mini": _openai(1.1, 4.4, 0.275),
    # The offline provider costs nothing.
    "offline": Price(0.0, 0.0, 0.0, 0.0),
}


class PriceTable:
    """Prices by model name (longest matching prefix). Immutable once built."""

    def __init__(self, prices: Mapping[str, Price] = DEFAULT_PRICES) -> None:
        self._prices = dict(prices)
        # Longest first, so the first key a name starts with is the most specific one.
        self._keys = sorted(self._prices, key=len, reverse=True)
        self._found: dict[str, Price | None] = {}

    @property
    def prices(self) -> Mapping[str, Price]:
        return dict(self._prices)

    def price(self, model: str) -> Price | None:
        """The price of ``model``, or None when no key matches it."""
        if model in self._found:
            return self._found[model]
        name = model.rsplit("/", 1)[-1].lower()
        found = next((self._prices[k] for k in self._keys if name.startswith(k.lower())), None)
        if len(self._found) < 1024:  # model names come from settings and logs: few
            self._found[model] = found
        return found

    def cost(self, model: str, usage: Mapping[str, Any]) -> float | None:
        """US dollars for one call of ``model`` with ``usage``; None for an unknown model."""
        price = self.price(model)
        return None if price is None else price.cost(usage)

    def updated(self, prices: Mapping[str, Price]) -> PriceTable:
        """This table with ``prices`` added or replacing same-named entries."""
        return PriceTable({**self._prices, **prices})


def parse_price_file(data: bytes, name: str) -> dict[str, Price]:
    """Prices from a TOML (``name`` ending ``.toml``) or JSON file::

        [models."claude-sonnet-4-5"]
        input = 3.0          # required, per million tokens
        output = 15.0        # required
        cache_write = 3.75   # optional, default: input
        cache_read = 0.30    # optional, default: input (no discount known)

    (JSON: ``{"models": {"claude-sonnet-4-5": {"input": 3.0, ...}}}``.) Raises
    :class:`PriceFileError` naming the first problem.
    """
    try:
        doc: Any = (tomllib.loads(data.decode()) if name.endswith(".toml")
                    else json.loads(data))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise PriceFileError(f"{name}: not valid {'TOML' if name.endswith('.toml') else 'JSON'}"
                             f" ({exc})") from exc
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, dict) or not models:
        raise PriceFileError(f"{name}: needs a 'models' table with at least one model")
    return {str(model): _price(name, str(model), fields) for model, fields in models.items()}


def _price(name: str, model: str, fields: Any) -> Price:
    if not isinstance(fields, dict):
        raise PriceFileError(f"{name}: model {model!r} needs input and output prices")
    unknown = sorted(set(fields) - {"input", "output", "cache_write", "cache_read"})
    if unknown:
        raise PriceFileError(f"{name}: model {model!r} has unknown field(s) {', '.join(unknown)}")
    values: dict[str, float] = {}
    for key in ("input", "output", "cache_write", "cache_read"):
        value = fields.get(key, fields.get("input") if key.startswith("cache") else None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise PriceFileError(f"{name}: model {model!r} needs {key} as a number >= 0 "
                                 "(US dollars per million tokens)")
        values[key] = float(value)
    return Price(**values)


def _tokens(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def total_tokens(usage: Mapping[str, Any], keys: Iterable[str] = (
        "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
        "output_tokens")) -> int:
    """All tokens of one call: every input part and the output."""
    return sum(_tokens(usage, key) for key in keys)
