-- trigger_time: a manual trigger's due time, one of its own among the task's triggers.
-- KEYS[1]  the task's last trigger time ({ns:P}:trig:<task_id>)
-- ARGV[1]  the caller's time (ms)   ARGV[2]  how long the last time is kept (ms)
-- Returns the caller's time, or 1 ms past the task's last trigger time when that is not
-- earlier: two triggers in one millisecond (a double click, two API nodes) would share a
-- schedule_id, and the second would never run (decided already under a policy, a
-- duplicate under the consumers' dedupe window) though it was answered queued.
local got = redis.pcall('GET', KEYS[1])  -- a key of another kind (an error): none
local last = type(got) == 'string' and tonumber(got) or nil
local t = tonumber(ARGV[1])
if last and last >= t then t = last + 1 end
local text = string.format('%d', t)
redis.call('SET', KEYS[1], text, 'PX', ARGV[2])
return text
