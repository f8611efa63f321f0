"""The price table in force: the built-in prices, updated from ``GATEWAY_PRICES_FILE``."""

from __future__ import annotations

from pathlib import Path

from gateway.edge.errors import ConfigError
from sessions.pricing import PriceFileError, PriceTable, parse_price_file


def load_prices(path: Path | None) -> PriceTable:
    """The built-in table, with ``path``'s models (TOML or JSON) added or replacing theirs.

    Raises :class:`ConfigError` naming the setting and the problem: a wrong price would
    mislead every report and budget, so the gateway does not start with one."""
    table = PriceTable()
    if path is None:
        return table
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"GATEWAY_PRICES_FILE: cannot read {path}: {exc.strerror}") from exc
    try:
        return table.updated(parse_price_file(data, path.name))
    except PriceFileError as exc:
        raise ConfigError(f"GATEWAY_PRICES_FILE: {exc}") from exc
