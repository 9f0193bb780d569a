-- action_fires: an operator's action triggering many tasks (POST /v1/tasks/actions with
-- "trigger"): append one fire per task to the type's stream, at most once per action.
-- KEYS[1]  the type's stream ({ns:q:<type>}:queue)
-- KEYS[2]  the action's marker hash in the stream's slot ({ns:q:<type>}:action:<action_id>)
-- ARGV[1]  enq_ms (Redis time of the call)   ARGV[2]  the type
-- ARGV[3]  due_ms: the action's time (1 ms later for the tasks with a grid time then,
--          sent in a call of their own), the same on every repeat of the action (its
--          schedule_id is task_id:due_ms, so a fire of an action has one id for good)
-- ARGV[4]  FLAG_ON: compact messages (task_id, payload, attempt, due_ms), '' = the full form
-- ARGV[5]  marker retention ms
-- ARGV[6..] groups of 3: task_id, payload (JSON), policy code ('' = none: field o)
-- Returns one flag per task: 1 appended now, 0 appended before by this action.
--
-- Why a marker here and not the partition's mark alone: the fire goes to the type's
-- stream, whose slot ({ns:q:<type>}) is not the partition's ({ns:P}), so in a Redis
-- Cluster no script can append the fire and move the partition's progress mark
-- (action_batch.lua) atomically. The applier therefore appends first (here: XADD only for
-- a task the action's marker lacks, then its field, one atomic step in the stream's slot:
-- append_once.lua) and moves the mark after. A node killed between the two leaves
-- the batch unmarked; whoever applies it again sends the same tasks here, finds their
-- fields and appends nothing twice, then moves the mark. Marking first would skip a
-- task whose append never happened. The marker outlives the action's record (both kept
-- ARGV[5]), so no repeat of the action can fire a task twice.
local stream, marker = KEYS[1], KEYS[2]
local enq, typ, due = ARGV[1], ARGV[2], ARGV[3]
local compact = ARGV[4] == FLAG_ON
local out = {}
for i = 6, #ARGV, 3 do
  local id = ARGV[i]
  out[#out + 1] = append_once(stream, marker, id, id, ARGV[i + 1], due, compact, typ, enq,
    ARGV[i + 2])
end
if #ARGV >= 6 then redis.call('PEXPIRE', marker, ARGV[5]) end
return out
