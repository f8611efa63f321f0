"""The price table: which price a model name gets, what a call costs, and price files."""

from __future__ import annotations

import re

import pytest

from sessions.pricing import (
    DEFAULT_PRICES,
    Price,
    PriceFileError,
    PriceTable,
    parse_price_file,
    total_tokens,
)

USAGE = {"input_tokens": 1_000, "cache_creation_input_tokens": 2_000,
         "cache_read_input_tokens": 10_000, "output_tokens": 500}


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("claude-sonnet-4-5", "claude-sonnet-4"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4"),
        ("claude-opus-4-5-20251101", "claude-opus-4-5"),
        ("claude-opus-4-1-20250805", "claude-opus-4"),
        ("claude-3-5-haiku-latest", "claude-3-5-haiku"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4.1-nano", "gpt-4.1-nano"),
        ("o3-mini", "o3-mini"),
        ("o3-pro", "o3-pro"),
        ("openai/gpt-5-mini", "gpt-5-mini"),
        ("GPT-5", "gpt-5"),
        ("offline-1", "offline"),
    ],
)
def test_longest_prefix_wins(model: str, key: str) -> None:
    """Dated versions, vendor paths and case take their family's price, the most specific."""
    assert PriceTable().price(model) == DEFAULT_PRICES[key]


@pytest.mark.parametrize("model", ["llama3.1", "mistral-large", "", "claude"])
def test_unknown_model_has_no_price(model: str) -> None:
    """A model no key matches has no cost, never a guessed one."""
    assert PriceTable().price(model) is None
    assert PriceTable().cost(model, USAGE) is None


def test_cost_adds_the_four_kinds() -> None:
    """Uncached input, cache writes, cache reads and output each at their own price."""
    price = Price(input=3.0, output=15.0, cache_write=3.75, cache_read=0.3)
    expected = (1_000 * 3.0 + 2_000 * 3.75 + 10_000 * 0.3 + 500 * 15.0) / 1_000_000
    assert price.cost(USAGE) == pytest.approx(expected)
    assert PriceTable({"m": price}).cost("m-1", USAGE) == pytest.approx(expected)
    assert price.cost({}) == 0.0
    assert price.cost({"input_tokens": -5, "output_tokens": True}) == 0.0
    assert total_tokens(USAGE) == 13_500


def test_anthropic_cache_prices_follow_the_input_price() -> None:
    """Anthropic: a cache write is 1.25x input, a read a tenth; OpenAI: writes cost input."""
    sonnet = DEFAULT_PRICES["claude-sonnet-4"]
    assert (sonnet.cache_write, sonnet.cache_read) == (pytest.approx(3.75), pytest.approx(0.3))
    mini = DEFAULT_PRICES["gpt-4o-mini"]
    assert (mini.cache_write, mini.cache_read) == (0.15, 0.075)


def test_toml_file_adds_and_replaces() -> None:
    """A TOML file adds a model and replaces a built-in one; cache prices default to input."""
    data = b"""
[models."claude-sonnet-4-5"]
input = 2.0
output = 10.0
cache_write = 2.5
cache_read = 0.2

[models.llama3]
input = 0.1
output = 0.2
"""
    table = PriceTable().updated(parse_price_file(data, "prices.toml"))
    assert table.price("claude-sonnet-4-5-20250929") == Price(2.0, 10.0, 2.5, 0.2)
    assert table.price("claude-sonnet-4") == DEFAULT_PRICES["claude-sonnet-4"]
    assert table.price("llama3.1:8b") == Price(0.1, 0.2, 0.1, 0.1)


def test_json_file() -> None:
    """The same table as JSON."""
    data = b'{"models": {"local": {"input": 0, "output": 0}}}'
    assert parse_price_file(data, "prices.json") == {"local": Price(0.0, 0.0, 0.0, 0.0)}


@pytest.mark.parametrize(
    ("data", "name", "message"),
    [
        (b"models = [", "p.toml", "not valid TOML"),
        (b"{", "p.json", "not valid JSON"),
        (b"[other]\nx = 1", "p.toml", "needs a 'models' table"),
        (b'{"models": {}}', "p.json", "needs a 'models' table"),
        (b'{"models": {"m": 3}}', "p.json", "needs input and output"),
        (b'{"models": {"m": {"input": 1}}}', "p.json", "needs output as a number"),
        (b'{"models": {"m": {"input": -1, "output": 1}}}', "p.json", "needs input as a number"),
        (b'{"models": {"m": {"input": "1", "output": 1}}}', "p.json", "needs input"),
        (b'{"models": {"m": {"input": 1, "output": 1, "cached": 1}}}', "p.json",
         "unknown field(s) cached"),
    ],
)
def test_bad_files_say_what_is_wrong(data: bytes, name: str, message: str) -> None:
    """Every malformed file is refused with its name and the first problem."""
    with pytest.raises(PriceFileError, match=re.escape(message)) as caught:
        parse_price_file(data, name)
    assert str(caught.value).startswith(name)
