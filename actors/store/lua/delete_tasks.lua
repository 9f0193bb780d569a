-- delete_tasks: delete tasks of one partition (task_delete.lua: delete_task).
-- KEYS[1]  schedule zset of the partition
-- ARGV[1]  partition tag   ARGV[2]  the type whose index named the ids (a clear of that
--          type: a task of another type is left, its stale index entry goes), '' = any
-- ARGV[3..]  pairs: task_id, bucket
-- Returns the number of tasks deleted. Callers bound the ids per call (a clear of a million
-- tasks is many short calls, never one long one).
local tag = ARGV[1]
local expect = ARGV[2] ~= '' and ARGV[2] or nil
local n = 0
for i = 3, #ARGV, 2 do
  if delete_task(tag, ARGV[i + 1], ARGV[i], KEYS[1], expect) then n = n + 1 end
end
if n > 0 then count_write(tag) end
return n
