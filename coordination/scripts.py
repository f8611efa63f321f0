"""The Lua scripts behind the Redis coordinator: a compare-and-set Redis has no command for.

A lease is extended or deleted only by the claim that took it (the key's value is the claim's
mark: its worker's id and a number of the worker's own): checking and acting are one script, so
a lease that lapsed and went to another worker meanwhile, or to a later claim of the same
worker, is never touched. (A leader lock's value is its worker's id: one election per job.)
Everything else (the queue, fencing tokens, dedup) lives in PostgreSQL
(:mod:`coordination.redis_queue`).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

# KEYS: lease; ARGV: owner (a claim's mark, a leader's id), ttl (ms) -> 1 extended, 0 not ours
EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: lease; ARGV: owner (as above) -> 1 deleted, 0 not ours
RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: lease; ARGV: the new claim's mark, ttl (ms) -> nil when taken now (SET NX PX), else the
# mark of the claim holding it (so the receiver can tell the holder's worker that a message
# waits: coordination.redis_queue, "lease kept a moment")
TAKE = """
local holder = redis.call('GET', KEYS[1])
if holder then
  return holder
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""


_loaded: weakref.WeakKeyDictionary[aioredis.Redis, set[str]] = weakref.WeakKeyDictionary()
"""The scripts each client has loaded (see :func:`run_many`)."""


async def run_many(redis: aioredis.Redis, script: AsyncScript,
                   calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
    """``script`` once per ``(keys, args)``, all in one pipeline: one round trip.

    redis-py's own way (a registered script called on a pipeline) first asks ``SCRIPT
    EXISTS`` on every execution, a round trip of its own. Here the pipeline sends
    ``EVALSHA`` at once: the script is loaded once per client first, and only a server that
    lost it since (restarted, flushed) costs a load and a second try: every call failed then,
    so none ran twice.
    """
    known = _loaded.setdefault(redis, set())
    if script.sha not in known:
        await redis.script_load(script.script)
        known.add(script.sha)
    for attempt in (1, 2):
        async with redis.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            results = await pipe.execute(raise_on_error=False)
        if attempt == 1 and any(isinstance(r, NoScriptError) for r in results):
            await redis.script_load(script.script)
            continue
        for result in results:
            if isinstance(result, Exception):
                raise result
        return list(results)
    raise AssertionError("unreachable")
