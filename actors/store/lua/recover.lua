-- recover: a consumer takes back what is pending under its own name and is not running
-- here: what an earlier incarnation of the name left (killed, or restarted by its
-- supervisor), or what a read whose reply was lost delivered.
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2]  consumer   ARGV[3]  most entries
-- ARGV[4]  min idle ms (0: all; a running consumer passes more than its renewal period,
--          so nothing it renews or has just read is taken)
-- ARGV[5]  max deliveries, at a consumer's start ('' = none: a lost read's messages)
-- Returns a list of {id, {field, value, ...}, deliveries, alone}: each entry is claimed
-- again by this same consumer with its idle time reset, atomically, so no claimer
-- elsewhere takes it from now on; alone is 1 for a suspect to run by itself (below), else
-- 0. Entries whose message was deleted meanwhile drop out of the PEL and are not returned.
-- A lost read's messages keep their delivery count (taking back is not a delivery, and
-- a higher count would make a message poison early), and so do those an earlier
-- incarnation released as it stopped (release.lua with a stop's ten years; over one here;
-- what a failed incarnation handed back, 30 days, is counted). At a
-- consumer's start each other one counts as delivered once more: its earlier incarnation
-- died holding it, maybe because of it. One delivered max deliveries times already is
-- not run again but handed to '<consumer>/poison' (a name no consumer has), idle a day,
-- its count kept: the claimer dead-letters it as poison (reclaim.lua), as it does a
-- message that killed consumers of other names. So a message that kills its process
-- cannot crash a stable name's process for ever.
-- Nor can it take the messages it ran beside with it: one delivered max deliveries - 2
-- times or more (held at earlier deaths, or taken over from dead consumers), which one
-- more death shared with a poison message would leave a delivery short of poison, is a
-- suspect, returned with alone = 1 and its count kept. The consumer runs its suspects
-- one at a time before anything else, counting each as delivered once more as it starts
-- (count_delivery.lua): a death while one runs alone counts against that one only, so
-- the messages read with a poison message run, and only the poison reaches the count.
local max = tonumber(ARGV[5] or '')
local released = 365 * 24 * 3600 * 1000  -- ms: a stop's release gives ten years
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', tonumber(ARGV[4] or 0),
  '-', '+', tonumber(ARGV[3]), ARGV[2])
local out = {}
for _, p in ipairs(pending) do
  local entry = redis.call('XRANGE', KEYS[1], p[1], p[1])
  if not entry[1] then
    redis.call('XACK', KEYS[1], ARGV[1], p[1])  -- deleted while pending: nothing to run
  elseif not max or p[3] >= released then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, p[1], 'JUSTID')
    out[#out + 1] = {p[1], entry[1][2], p[4], 0}
  elseif p[4] >= max then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2] .. '/poison', 0, p[1], 'IDLE', 86400000,
      'RETRYCOUNT', p[4], 'JUSTID')
  elseif p[4] >= max - 2 then  -- a suspect: counted when it starts alone
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, p[1], 'RETRYCOUNT', p[4], 'JUSTID')
    out[#out + 1] = {p[1], entry[1][2], p[4], 1}
  else
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, p[1], 'RETRYCOUNT', p[4] + 1, 'JUSTID')
    out[#out + 1] = {p[1], entry[1][2], p[4] + 1, 0}
  end
end
return out
