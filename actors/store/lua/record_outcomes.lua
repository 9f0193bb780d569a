-- record_outcomes: update tasks of one partition after their fires ran.
-- KEYS[1]  schedule zset of the partition (only for its slot)
-- ARGV[1]  partition tag
-- ARGV[2..] groups of 5: task_id, bucket, outcome code (0 ok, 1 retry, 2 dead), finished_ms,
--           error ('' = none)
-- Returns the number of tasks updated (a deleted task is skipped).
-- ok resets the consecutive-failure count (retries) and forgets the last error; retry and
-- dead increase it and keep the error in the partition's errors hash.
-- Outcomes go to the task's run record, never its state record: the state is its poller's
-- and the API's alone (commit_fires relies on that). A task without a run record (not run
-- since it was created, or since layout 2) starts from the counts in its state record.
local tag = ARGV[1]
local n = 0
for i = 2, #ARGV, 5 do
  local id, b, outcome = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local r = get_run(tag, b, id)
  if r then
    local failed_before = r[4] and r[4] ~= 0  -- only then is there an error to forget
    r[3], r[4] = tonumber(ARGV[i + 3]), outcome
    if outcome == 0 then
      r[1], r[2] = (r[1] or 0) + 1, nil
      if failed_before then redis.call('HDEL', tag .. ':errors', id) end
    else
      r[2] = (r[2] or 0) + 1
      redis.call('HSET', tag .. ':errors', id, ARGV[i + 4])
    end
    redis.call('HSET', tag .. ':run:' .. b, id, cmsgpack.pack(r[1], r[2], r[3], r[4]))
    n = n + 1
  end
end
return n
