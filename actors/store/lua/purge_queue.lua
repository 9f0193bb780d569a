-- purge_queue: delete a batch of a type's undelivered messages (the backlog no consumer
-- has read); messages being run (pending) are never touched.
-- KEYS[1]  the type's stream   KEYS[2]  its cancel hash (cancel_fires.lua, same slot)
-- ARGV[1]  group   ARGV[2]  last id to consider (inclusive)
-- ARGV[3]  most entries to delete in this call
-- Returns {the number deleted, ended}: ended lists task_id, due_ms, policy code of each
-- deleted message that has a policy (field o: its task's flight ends with it,
-- end_flights.lua). A deleted cancel_other fire's cancel request goes with it, as an
-- ended fire's goes with its ACK (ack.lua): left, it would cancel a later fire of the
-- same schedule id (a backfill of the purged window). Undelivered = after the group's last-delivered id (a group
-- delivers in id order); without a group every entry is undelivered. Callers loop until a
-- call deletes fewer than ARGV[3], bounded by ARGV[2] so new fires cannot keep it going.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, {}}
end
local start = '-'
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
  if info['name'] == ARGV[1] then
    start = '(' .. info['last-delivered-id']
  end
end
local entries = redis.call('XRANGE', KEYS[1], start, ARGV[2], 'COUNT', tonumber(ARGV[3]))
local ended = {}
for _, e in ipairs(entries) do
  redis.call('XDEL', KEYS[1], e[1])
  local raw, f = e[2], {}
  for j = 1, #raw, 2 do f[raw[j]] = raw[j + 1] end
  if f.o and f.task_id and f.due_ms then
    ended[#ended + 1], ended[#ended + 2], ended[#ended + 3] = f.task_id, f.due_ms, f.o
    if string.sub(f.o, 1, 1) == 'C' then
      redis.pcall('HDEL', KEYS[2], f.task_id .. ':' .. f.due_ms)  -- rejected: lapses
    end
  end
end
return {#entries, ended}
