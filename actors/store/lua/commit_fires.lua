-- commit_fires: advance the schedule of claimed tasks whose fires are in their stream.
-- KEYS[1]  schedule zset of the partition   KEYS[2]  the partition's owner hash
-- ARGV[1]  partition tag   ARGV[2]  poller id   ARGV[3]  claim token
-- ARGV[4..] groups of 7: task_id, bucket, next_ms ('' = finished), score,
--           fired (count enqueued), due_ms and updated_ms (as the claim read them)
-- Returns {earliest score in the zset after the commit or -1, lost ids...}. Fencing: if
-- the partition is no longer this poller's, or the claim is no longer in flight (another
-- owner took the partition over), every id is lost and nothing changes: the new owner
-- claims those grid times again. A task is also lost when an API write changed it since the
-- claim (its updated_ms or grid time moved: updated, paused, stopped, deleted and created
-- again) or deleted it; it is left as that write put it.
local tag, me, token = ARGV[1], ARGV[2], ARGV[3]
local o = redis.call('HMGET', KEYS[2], 'poller', 'inflight')
local inflight = o[2] or ''
local at = string.find(' ' .. inflight, ' ' .. token .. ':', 1, true)
local out = {-1}
if o[1] ~= me or not at then
  for i = 4, #ARGV, 7 do out[#out + 1] = ARGV[i] end
  return out
end
local keep = false
local function out_with_earliest(reply)
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] then reply[1] = tonumber(first[2]) end
  return reply
end
for i = 4, #ARGV, 7 do
  local id, b, nxt, score, fired = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], tonumber(ARGV[i+4])
  local s = get_state(tag, b, id)
  local due, version = tonumber(ARGV[i+5]), tonumber(ARGV[i+6])
  if s and s[1] == ACTIVE and s[2] == due and (s[4] or 0) == version then
    s[9] = nil  -- a claim token an older version wrote
    s[3] = s[3] + fired
    if nxt == '' then
      s[1], s[2] = FINISHED, nil
      redis.call('ZREM', KEYS[1], id)
    else
      s[2] = tonumber(nxt)
      redis.call('ZADD', KEYS[1], score, id)
    end
    put_state(tag, b, id, s)
  else
    out[#out + 1] = id
    -- changed but not moved (e.g. a new payload): its grid time is claimed again, and
    -- must find this claim's fires (kept in flight until the dedupe window forgets it)
    keep = keep or (s ~= nil and s[2] == due)
  end
end
if keep then return out_with_earliest(out) end
-- this claim is done: drop it from the partition's claims in flight
local rest = {}
for entry in string.gmatch(inflight, '%S+') do
  if string.sub(entry, 1, #token + 1) ~= token .. ':' then rest[#rest + 1] = entry end
end
redis.call('HSET', KEYS[2], 'inflight', table.concat(rest, ' '))
return out_with_earliest(out)
