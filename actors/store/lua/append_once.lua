-- append_once.lua: put before the scripts that append an operator's fires at most once
-- (backfill.lua, action_fires.lua). A fire is appended only if its field in the marker
-- hash (in the stream's slot) is new: HSETNX decides and the XADD follows in the same
-- script, so two calls racing over one fire append it once. Messages are written as
-- enqueue.lua writes them: attempt 0, schedule_id = task_id:due_ms, the compact form or
-- the full one, and the policy code (field o) when there is one.
-- Returns 1 when it appended the fire, 0 when the marker had it already.
local function append_once(stream, marker, field, id, payload, due, compact, typ, enq, policy)
  if redis.call('HSETNX', marker, field, '') == 0 then return 0 end
  local f = {'task_id', id, 'payload', payload, 'attempt', '0', 'due_ms', due}
  if not compact then
    for _, v in ipairs({'schedule_id', id .. ':' .. due, 'type', typ, 'enq_ms', enq}) do
      f[#f + 1] = v
    end
  end
  if policy ~= '' then f[#f + 1], f[#f + 2] = 'o', policy end
  redis.call('XADD', stream, '*', unpack(f))
  return 1
end
