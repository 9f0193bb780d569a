-- append_once.lua: put before the scripts that append an operator's fires at most once
-- (backfill.lua, action_fires.lua). A fire is appended only if its field in the marker
-- hash (in the stream's slot) is new: the field is looked up, the XADD follows and the
-- field is written last, in the same script, so two calls racing over one fire append it
-- once, and an XADD Redis rejects (the stream key holding another kind of value) leaves
-- no field behind (a script's earlier writes stay when a later command fails): the call
-- repeated once the key is mended appends the fire. A field 'h' marks a fire its call's
-- overlap policy held back (backfill.py, apply_actions.py): its poller appends it, and a
-- repeat of the call leaves it be; if a decision hands it back to such a call all the
-- same (appended again: its poller died before confirming), it is appended here, never
-- confirmed in flight with no message behind it. Messages are written as
-- enqueue.lua writes them: attempt 0, schedule_id = task_id:due_ms, the compact form or
-- the full one, and the policy code (field o) when there is one.
-- Returns 1 when it appended the fire, 0 when the marker had it already.
local function append_once(stream, marker, field, id, payload, due, compact, typ, enq, policy)
  local mark = redis.call('HGET', marker, field)
  if mark and mark ~= 'h' then return 0 end
  local f = {'task_id', id, 'payload', payload, 'attempt', '0', 'due_ms', due}
  if not compact then
    for _, v in ipairs({'schedule_id', id .. ':' .. due, 'type', typ, 'enq_ms', enq}) do
      f[#f + 1] = v
    end
  end
  if policy ~= '' then f[#f + 1], f[#f + 2] = 'o', policy end
  redis.call('XADD', stream, '*', unpack(f))
  redis.call('HSET', marker, field, '')
  return 1
end
