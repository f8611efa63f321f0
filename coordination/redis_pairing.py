"""The pairing document in Redis, shared by workers and the operator's CLI.

:class:`gateway.edge.pairing.PairingState` is synchronous (access control decides inline), so this
uses redis-py's blocking client with short timeouts: one ``GET`` per check of a paired or
pending person, as the file state reads a file. Updates are optimistic transactions
(``WATCH``/``MULTI``), retried on a conflict, so two workers never lose each other's change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import orjson
import redis
from redis.exceptions import WatchError

T = TypeVar("T")

TIMEOUT = 2.0
MAX_TRIES = 20


class RedisPairingState:
    """See :class:`gateway.edge.pairing.PairingState`; the document is one JSON string key."""

    def __init__(self, url: str, key: str) -> None:
        self._client = redis.Redis.from_url(url, socket_timeout=TIMEOUT,
                                            socket_connect_timeout=TIMEOUT)
        self.key = key

    def __repr__(self) -> str:
        return f"RedisPairingState(key={self.key!r})"  # never the URL: it may hold a password

    def read(self) -> dict[str, Any]:
        return _decode(self._client.get(self.key))

    def update(self, change: Callable[[dict[str, Any]], T]) -> T:
        for _ in range(MAX_TRIES):
            with self._client.pipeline() as pipe:
                try:
                    pipe.watch(self.key)  # type: ignore[no-untyped-call]  # unannotated in redis-py
                    raw = pipe.get(self.key)
                    data = _decode(raw)
                    result = change(data)
                    encoded = orjson.dumps(data)
                    if raw is None or encoded != raw:
                        pipe.multi()
                        pipe.set(self.key, encoded)
                        pipe.execute()
                    return result
                except WatchError:
                    continue
        raise RuntimeError("pairing state: too many conflicting updates")

    def close(self) -> None:
        self._client.close()


def _decode(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    value = orjson.loads(raw)
    return value if isinstance(value, dict) else {}
