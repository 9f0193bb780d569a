-- begin_runs: mark fires as started, so a second message for the same fire is recognised.
-- KEYS[1]  the type's stream (only for its slot; the seen keys share its tag)
-- ARGV[1]  seen-key prefix ({ns:q:<type>}:seen:)   ARGV[2]  window_ms
-- ARGV[3..] groups of 2: message id, fire key (schedule_id:attempt)
-- Returns one flag per message: 1 run it, 0 a duplicate (another message of this fire
-- started within the window). A message seen before under its own id (reclaimed after its
-- consumer died) is not a duplicate: it runs again.
local out = {}
for i = 3, #ARGV, 2 do
  local key = ARGV[1] .. ARGV[i + 1]
  local ok = redis.call('SET', key, ARGV[i], 'NX', 'PX', ARGV[2])
  if ok then
    out[#out + 1] = 1
  elseif redis.call('GET', key) == ARGV[i] then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
