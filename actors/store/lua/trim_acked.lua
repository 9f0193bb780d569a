-- trim_acked: drop a stream's acknowledged entries from its head, a whole node at a time.
-- KEYS[1]  the type's stream   ARGV[1]  group   ARGV[2]  most entries to trim in this call
-- Returns the number of entries trimmed (the caller calls again while some were: a backlog
-- goes in steps that each hold Redis briefly).
-- Consumers acknowledge finished messages (XACK) without deleting them one by one: an XDEL
-- per fire was a tenth of Redis's work a fire. Everything older than both the oldest
-- pending entry and the group's last-delivered id was delivered and acknowledged, so it
-- goes; MINID with '~' frees whole listpack nodes only (cheap; a node's worth of
-- acknowledged entries may stay until the next round). Trimming only the head keeps the
-- group's lag exact, so undelivered counts stay right. The limit is explicit: XTRIM's
-- own default for '~' (100 nodes, 10,000 entries) trimmed less a second than 20,000
-- fires/s appended, and the stream grew without end.
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
if not ok then return 0 end  -- no stream yet
local floor
for _, g in ipairs(groups) do
  local info = {}
  for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
  if info['name'] == ARGV[1] then floor = info['last-delivered-id'] end
end
if not floor or floor == '0-0' then return 0 end
local function before(a, b)  -- stream ids 'ms-seq'
  local am, as = string.match(a, '(%d+)-(%d+)')
  local bm, bs = string.match(b, '(%d+)-(%d+)')
  am, bm = tonumber(am), tonumber(bm)
  return am < bm or (am == bm and tonumber(as) < tonumber(bs))
end
local summary = redis.call('XPENDING', KEYS[1], ARGV[1])
if summary[1] > 0 and before(summary[2], floor) then floor = summary[2] end
return redis.call('XTRIM', KEYS[1], 'MINID', '~', floor, 'LIMIT', tonumber(ARGV[2]))
