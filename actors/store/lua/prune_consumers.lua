-- prune_consumers: remove consumers that are gone and hold nothing.
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2]  min idle ms   ARGV[3]  this consumer
-- Returns the names removed. A consumer is removed only with 0 pending (never losing a PEL
-- entry) and idle longer than min idle (a live one reads every few hundred ms); were a
-- live one removed all the same, its next read would simply recreate it.
local removed = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for j = 1, #c, 2 do info[c[j]] = c[j + 1] end
  if info['name'] ~= ARGV[3] and info['pending'] == 0 and info['idle'] > tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    removed[#removed + 1] = info['name']
  end
end
return removed
