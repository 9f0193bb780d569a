-- schedule_retries: save retry contexts and add them to the partition's retry zset.
-- KEYS[1]  retry zset of the partition
-- ARGV[1]  retry-context key prefix ({ns:P}:retry:)   ARGV[2]  partition tag
-- ARGV[3]  buckets per partition
-- ARGV[4..] groups of 10: schedule_id, delay_ms, task_id, type, payload, attempt
--           (of the retry), due_ms, last_error, policy code ('' = none), the failed
--           message's stream entry id (kept in 'from')
-- The retry is due at Redis's TIME + delay_ms: one clock for every node (a node whose own
-- clock is skewed neither retries early nor late). Each context keeps in 'born' its task's
-- created_ms now (0: no such task; none kept for a definition without one or one that
-- cannot be read), so that
-- claim_retries.lua drops the retry if the task is deleted and created again under its id
-- before the retry comes due.
-- Returns the number saved. Idempotent per schedule_id: a context already written from
-- the same message (this write sent again, or the message run again after its consumer
-- died, reclaimed and failed again) is kept as it is, its claim too, so a dispatcher
-- that took it appends it once; nor does a failure of an earlier attempt (its message
-- run again late) write over a context of a later one. A failure met again after the
-- dispatcher appended the retry and forgot its context adds one more run of that
-- attempt: at least once, as for any fire whose consumer died before its ACK.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tag, buckets = ARGV[2], tonumber(ARGV[3])
-- Save the retry of group i unless it is written already (or a later attempt's is) for
-- the same task (not one deleted since and created again under its id: its retry is
-- dropped when claimed), and scheduled: a call stopped after writing a context (its
-- retry zset of another kind) writes it in full when sent again.
local function save(i)
  local sid = ARGV[i]
  -- Every read before the first write: a script stopped by an error keeps what it wrote.
  local born = created_ms(tag, bucket_of(ARGV[i + 2], buckets), ARGV[i + 2])
  local held = redis.call('HMGET', ARGV[1] .. sid, 'from', 'attempt', 'born')
  if (held[1] == ARGV[i + 9] or (tonumber(held[2]) or -1) > tonumber(ARGV[i + 5]))
      and (held[3] or '') == (born and ms(born) or '')
      and redis.call('ZSCORE', KEYS[1], sid) then
    return
  end
  local retry_at = string.format('%d', now + tonumber(ARGV[i + 1]))
  redis.call('HSET', ARGV[1] .. sid, 'task_id', ARGV[i + 2], 'type', ARGV[i + 3],
    'payload', ARGV[i + 4], 'attempt', ARGV[i + 5], 'due_ms', ARGV[i + 6],
    'last_error', ARGV[i + 7], 'retry_at_ms', retry_at, 'from', ARGV[i + 9])
  if born then  -- nil or false: none to keep
    redis.call('HSET', ARGV[1] .. sid, 'born', ms(born))
  else
    redis.call('HDEL', ARGV[1] .. sid, 'born')
  end
  if ARGV[i + 8] ~= '' then
    redis.call('HSET', ARGV[1] .. sid, 'o', ARGV[i + 8])
    redis.call('HDEL', ARGV[1] .. sid, 'claim', 'priors')
  else
    redis.call('HDEL', ARGV[1] .. sid, 'claim', 'priors', 'o')
  end
  redis.call('ZADD', KEYS[1], retry_at, sid)
end

local n = 0
for i = 4, #ARGV, 10 do
  save(i)
  n = n + 1
end
return n
