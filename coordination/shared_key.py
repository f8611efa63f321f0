"""A secret every worker of one deployment must hold alike, agreed on through their Redis.

The web identity key (:mod:`channels.web.identity`) signs the browsers' cookies and names the
cookie-less clients' addresses; a web conversation is keyed by that person. Workers with data
folders of their own each made their own key, so a browser that was one person on one worker
was another on the next (its cookie refused there), and with conversations keyed by the
person, its conversation broke in two behind a load balancer. So the workers agree on one:

* each offers the key it has (``SET {p}<name> <key> NX``: the first offer is kept) and takes
  what Redis holds;
* a worker whose own key differs writes the agreed one back to its file (the caller does), so
  when Redis loses the key (flushed, restarted without persistence) the first worker to start
  offers the agreed key again and nobody's identity changes.

The key has no expiry (like the pairing document). Redis unreachable at start: the worker
keeps its own key and says so in the log; browsers that move between workers then change
person until it restarts with Redis back.
"""

from __future__ import annotations

import base64
import logging

import redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0


def agreed_key(url: str, name: str, mine: bytes) -> bytes:
    """The key the workers sharing the Redis at ``url`` hold under ``name``: ``mine`` when it
    is the first offered, else the one offered first. Blocking (one round trip), called once
    while the gateway is composed. ``mine`` when Redis cannot be reached."""
    client = redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT,
                                  socket_timeout=CONNECT_TIMEOUT)
    try:
        with client.pipeline(transaction=True) as pipe:
            pipe.set(name, base64.b64encode(mine), nx=True)
            pipe.get(name)
            _, held = pipe.execute()
    except RedisError as exc:
        log.warning("the web identity key could not be agreed with the other workers "
                    "through Redis (%s); this worker uses its own until it restarts",
                    type(exc).__name__)
        return mine
    finally:
        client.close()
    if not isinstance(held, bytes):  # deleted between the two commands: ours stands
        return mine
    try:
        agreed = base64.b64decode(held, validate=True)
    except ValueError:
        agreed = b""
    if len(agreed) < len(mine):
        log.warning("%s in Redis is not a key; this worker uses its own", name)
        return mine
    return agreed
