-- purge_queue: delete a batch of a type's undelivered messages (the backlog no consumer
-- has read); messages being run (pending) are never touched.
-- KEYS[1]  the type's stream   KEYS[2]  its cancel hash (cancel_fires.lua, same slot)
-- ARGV[1]  group   ARGV[2]  last id to consider (inclusive)
-- ARGV[3]  most entries to delete in this call
-- ARGV[4]  '1': look only (delete nothing): what a call would delete, so that the flights
--          those fires hold are ended before the fires go
-- Returns {the number deleted (or found), ended, the last id deleted (or found) or ''}:
-- ended lists task_id, due_ms, policy code of each message that has a policy (field o:
-- its task's flight ends with it, end_flights.lua). Callers look first, end those flights,
-- then delete up to the last id found: a delete whose flights were not ended first (the
-- flight calls refused, under maxmemory; the caller cut off) would leave the tasks' marks
-- naming fires that are gone, and the tasks stuck behind them for good; a fire that a
-- consumer reads in between runs with its flight ended, as if it had no policy.
-- A deleted tracked fire's cancel request (skip, buffer_*, cancel_other: a trigger or
-- backfill under cancel_other may cancel any of them) goes with it, as an ended fire's
-- goes with its ACK (ack.lua): left, it would cancel a later fire of the same schedule id
-- (a backfill of the purged window). Undelivered = after the group's last-delivered id (a
-- group delivers in id order); without a group every entry is undelivered. Callers loop
-- until a call finds fewer than ARGV[3], bounded by ARGV[2] so new fires cannot keep it
-- going.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, {}, ''}
end
local look = ARGV[4] == '1'
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
  if not look then redis.call('XDEL', KEYS[1], e[1]) end
  local raw, f = e[2], {}
  for j = 1, #raw, 2 do f[raw[j]] = raw[j + 1] end
  if f.o and f.task_id and f.due_ms then
    ended[#ended + 1], ended[#ended + 2], ended[#ended + 3] = f.task_id, f.due_ms, f.o
    if not look and f.o ~= '' and string.find(TRACKED_POLICIES, string.sub(f.o, 1, 1), 1, true) then
      redis.pcall('HDEL', KEYS[2], f.task_id .. ':' .. f.due_ms)  -- rejected: lapses
    end
  end
end
return {#entries, ended, entries[1] and entries[#entries][1] or ''}
