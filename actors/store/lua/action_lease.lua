-- action_lease: an operator's action's record and the lease of the node applying it
-- (actors/store/actions.py). Both keys share the tag {ns:actions}.
-- KEYS[1]  the record ({ns:actions}:action:<action_id>: hash action, spec, key_id, created_ms,
--          state (applying | done), holder, until, done_ms)
-- KEYS[2]  the actions not done ({ns:actions}:open: zset action_id -> lease until ms)
-- ARGV[1]  create | take | renew | finish   ARGV[2]  the holder (host:pid:instance:token)
-- ARGV[3]  lease ms   ARGV[4]  record retention ms
-- create: ARGV[5] the spec (JSON), ARGV[6] the key id, ARGV[7] created_ms: writes the
--         record held by ARGV[2]; {1} created, {0, spec} when the id exists already
-- take:   ARGV[5] a holder the caller saw gone ('' = none): the lease is taken when it
--         ran out, is that holder's or the caller's own; {1} taken, {0, holder, until,
--         state} not (held by another, or done), {-2} no such action
-- renew:  {1} while ARGV[2] holds it, {0} otherwise
-- finish: state done, out of the open set; {1} while ARGV[2] held it, {0} otherwise
local record, open, op, holder = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease_end = string.format('%d', now + tonumber(ARGV[3]))
local id = string.match(record, '}:action:(.*)$')
if op == 'create' then
  local spec = redis.call('HGET', record, 'spec')
  if spec then return {0, spec} end
  redis.call('HSET', record, 'spec', ARGV[5], 'key_id', ARGV[6], 'created_ms', ARGV[7],
    'state', 'applying', 'holder', holder, 'until', lease_end)
  redis.call('PEXPIRE', record, ARGV[4])
  redis.call('ZADD', open, lease_end, id)
  return {1}
end
local state = redis.call('HGET', record, 'state')
if not state then
  redis.call('ZREM', open, id)
  return {-2}
end
local current = redis.call('HGET', record, 'holder') or ''
-- a lease end that is not a number (another program's record) counts as run out
local ends = tonumber(redis.call('HGET', record, 'until') or 0) or 0
if op == 'take' then
  if state ~= 'applying' then return {0, current, string.format('%d', ends), state} end
  if ends > now and current ~= '' and current ~= ARGV[5] and current ~= holder then
    return {0, current, string.format('%d', ends), state}
  end
  redis.call('HSET', record, 'holder', holder, 'until', lease_end)
  redis.call('ZADD', open, lease_end, id)
  return {1}
end
if current ~= holder or state ~= 'applying' then return {0} end
if op == 'renew' then
  redis.call('HSET', record, 'until', lease_end)
  redis.call('ZADD', open, lease_end, id)
  return {1}
end
redis.call('HSET', record, 'state', 'done', 'done_ms', string.format('%d', now), 'holder', '')
redis.call('ZREM', open, id)
return {1}
