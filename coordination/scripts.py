"""The Lua scripts behind the Redis coordinator: a compare-and-set Redis has no command for.

A lease is extended or deleted only by the claim that took it (the key's value is the claim's
mark: its worker's id and a number of the worker's own): checking and acting are one script, so
a lease that lapsed and went to another worker meanwhile, or to a later claim of the same
worker, is never touched. (A leader lock's value is its worker's id: one election per job.)
Everything else (the queue, fencing tokens, dedup) lives in PostgreSQL
(:mod:`coordination.redis_queue`).
"""

from __future__ import annotations

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
