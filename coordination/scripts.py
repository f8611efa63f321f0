"""The Lua scripts behind the Redis coordinator: a compare-and-set Redis has no command for.

A lease is extended or deleted only by the worker that owns it (its owner id is the key's
value): checking and acting are one script, so a lease that lapsed and went to another worker
meanwhile is never touched. Everything else (the queue, fencing tokens, dedup) lives in
PostgreSQL (:mod:`coordination.redis_queue`).
"""

from __future__ import annotations

# KEYS: lease; ARGV: owner, ttl (ms) -> 1 extended, 0 not ours
EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: lease; ARGV: owner -> 1 deleted, 0 not ours
RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
