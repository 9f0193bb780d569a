-- record_outcomes: update tasks of one partition after their fires ran.
-- KEYS[1]  schedule zset of the partition (only for its slot)
-- ARGV[1]  partition tag
-- ARGV[2..] groups of 5: task_id, bucket, outcome code (0 ok, 1 retry, 2 dead), finished_ms,
--           error ('' = none)
-- Returns the number of tasks updated (a deleted task is skipped).
-- ok resets the consecutive-failure count (retries) and forgets the last error; retry and
-- dead increase it and keep the error in the partition's errors hash.
local tag = ARGV[1]
local n = 0
for i = 2, #ARGV, 5 do
  local id, b, outcome = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local s = get_state(tag, b, id)
  if s then
    local failed_before = s[8] and s[8] ~= 0  -- only then is there an error to forget
    s[7], s[8] = tonumber(ARGV[i + 3]), outcome
    if outcome == 0 then
      s[5], s[6] = s[5] + 1, nil
      if failed_before then redis.call('HDEL', tag .. ':errors', id) end
    else
      s[6] = (s[6] or 0) + 1
      redis.call('HSET', tag .. ':errors', id, ARGV[i + 4])
    end
    put_state(tag, b, id, s)
    n = n + 1
  end
end
return n
