"""The Lua scripts behind the Redis coordinator: each step that must be atomic is one script.

Redis runs a script without interleaving any other command, which is what makes the queue
hand-off safe: a message pushed while its conversation's holder finds the queue empty either
lands before that check (the holder serves it) or after the lease is gone (the pusher takes
the lease and serves it). Queue entries are ``<id> <json>`` (see :mod:`.keys`).
"""

from __future__ import annotations

# KEYS: dedup, queue, lease, fence, active
# ARGV: item, dedup ttl (s), owner, lease ttl (ms), active member, use dedup ("1"/"0"), item id
# -> -1 duplicate (nothing queued), 0 queued for the current holder, N > 0 claimed with token N
ENQUEUE = """
if ARGV[6] == '1' and not redis.call('SET', KEYS[1], ARGV[7], 'NX', 'EX', ARGV[2]) then
  return -1
end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[5], ARGV[5])
if redis.call('SET', KEYS[3], ARGV[3], 'NX', 'PX', ARGV[4]) then
  return redis.call('INCR', KEYS[4])
end
return 0
"""

_POP_DONE = """
if ARGV[2] ~= '' then
  local head = redis.call('LINDEX', KEYS[2], 0)
  if head and string.sub(head, 1, #ARGV[2] + 1) == ARGV[2] .. ' ' then
    redis.call('LPOP', KEYS[2])
    redis.call('DEL', KEYS[3])
  end
end
"""

# KEYS: lease, queue, inflight, active
# ARGV: owner, id of the item just finished (or ""), active member
# -> {"lost"} | {"empty"} (lease released) | {"item", head, "1" if an earlier holder started it}
ADVANCE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'lost'}
end
""" + _POP_DONE + """
local head = redis.call('LINDEX', KEYS[2], 0)
if not head then
  redis.call('DEL', KEYS[1], KEYS[3])
  redis.call('SREM', KEYS[4], ARGV[3])
  return {'empty'}
end
local id = string.sub(head, 1, string.find(head, ' ', 1, true) - 1)
local started = redis.call('GET', KEYS[3]) == id
redis.call('SET', KEYS[3], id)
if started then
  return {'item', head, '1'}
end
return {'item', head, '0'}
"""

# Same KEYS/ARGV as ADVANCE. Gives the lease up; items left stay queued for adoption.
# -> 1 released, 0 not ours any more
RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
""" + _POP_DONE + """
redis.call('DEL', KEYS[1])
if redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[3])
  redis.call('SREM', KEYS[4], ARGV[3])
end
return 1
"""

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

# KEYS: lease, queue, fence, active; ARGV: owner, ttl (ms), active member
# -> token N > 0 when adopted; 0 when it has a holder or nothing to serve (then forgotten)
ADOPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('SREM', KEYS[4], ARGV[3])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return redis.call('INCR', KEYS[3])
"""

# KEYS: lease, fence; ARGV: owner, wanted token -> the new token, 0 when the lease is not ours
REFENCE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
local wanted = tonumber(ARGV[2])
if current < wanted then
  redis.call('SET', KEYS[2], wanted)
  return wanted
end
return redis.call('INCR', KEYS[2])
"""
