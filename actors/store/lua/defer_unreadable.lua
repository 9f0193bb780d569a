-- defer_unreadable: move due tasks whose records the poller could not read a little on,
-- so that they hold no place in the partition's claims (a partition whose oldest due
-- tasks were all such claimed nothing else); they stay in the schedule, due again then.
-- KEYS[1]  the partition's schedule zset   KEYS[2]  its owner hash ({ns:P}:poller)
-- ARGV[1]  the partition's count of writes the claim read   ARGV[2]  the new score
-- ARGV[3..]  task ids
-- Nothing moves if the count changed since the claim (an API write mended, deleted or
-- created a task of the partition, or another poller took it over): the next claim
-- judges the tasks again. ZADD XX: a task gone stays gone; GT: one due later keeps it.
-- Returns the number moved.
if tonumber(redis.call('HGET', KEYS[2], 'writes') or 0) ~= tonumber(ARGV[1]) then
  return 0
end
local args = {'ZADD', KEYS[1], 'XX', 'GT', 'CH'}
for i = 3, #ARGV do
  args[#args + 1] = ARGV[2]
  args[#args + 1] = ARGV[i]
end
return redis.call(unpack(args))
