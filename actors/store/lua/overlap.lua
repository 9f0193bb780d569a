-- overlap: decide which planned fires of tasks with an overlap policy start now, and note
-- the fires not run (overlap, expired). One call per partition per tick, only for the
-- claimed tasks that have a policy or an expired fire; atomic with the in-flight marks.
-- KEYS[1]  the partition's flight hash ({ns:P}:flight)   KEYS[2]  its not-run hash
-- ARGV[1]  most fires a buffer_all task keeps waiting   ARGV[2]  this claim's token
-- ARGV[3]  tokens of the partition's claims never committed (space separated: a poller
--          that died between this step and its commit)
-- ARGV[4]  '1': a poller's claim of grid times ('' = an operator's trigger or backfill)
-- ARGV[5..] per task: task_id, policy (A allow_all, S skip, 1 buffer_one, B buffer_all,
--           C cancel_other), '1' if the plan ends the task's grid ('' otherwise), n, m,
--           then n planned due times (grid order), then m expired due times (later than
--           the catch-up window: not run, only noted)
-- Returns per task: {task_id, due times to enqueue (comma separated; one an earlier claim
-- put in flight is prefixed 'r': if the enqueue finds it appended already, that copy is
-- the one in flight), due times of fires to cancel (comma separated), skipped due times
-- (comma separated), the due time in flight they waited on ('' = none), the last grid
-- time if the grid ended with fires still waiting ('' = none: the poller keeps the task
-- scheduled until they start), how many planned due times were decided before}.
--
-- The fire in flight is a task's fire from its enqueue until it is acknowledged,
-- dead-lettered or its retries end (end_flights.lua). skip: a due time that comes while
-- one is in flight is not run; buffer_one: one waits, later ones are not run;
-- buffer_all: all wait (up to ARGV[1]), in grid order; cancel_other: the one in flight is
-- asked to cancel (cancel_fires.lua) and the newest due time waits for it to end.
-- Repeats are safe: the same claim sent again after a lost reply, or the next claim after
-- a poller died before its commit, finds the fire it put in flight and enqueues it again
-- (the enqueue markers drop the copy); a grid time decided before (in flight, waiting,
-- skipped, or run and ended) is not decided again.
local cap, token = tonumber(ARGV[1]), ARGV[2]
local dead = {}
for t in string.gmatch(ARGV[3], '%S+') do dead[t] = true end
local grid = ARGV[4] == '1'
local out = {}
local i = 5
while i <= #ARGV do
  local id, policy, ends = ARGV[i], ARGV[i + 1], ARGV[i + 2] == '1'
  local n, m = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
  local first = i + 5
  i = first + n + m
  local run, skipped, cancel, blocking, park, before = {}, {}, {}, '', '', 0
  if policy ~= 'A' then
    local f = get_flight(KEYS[1], id)
    local function start(d)
      f.inflight, f.replaced, f.by = d, '', token
      run[#run + 1] = d
    end
    if f.inflight ~= '' and (f.by == token or dead[f.by]) then  -- maybe never enqueued
      run[#run + 1] = 'r' .. f.inflight
      if f.replaced ~= '' then cancel[#cancel + 1] = f.replaced end
      f.by = token
    elseif f.inflight == '' and #f.waiting > 0 then  -- a waiting fire starts first
      start(table.remove(f.waiting, 1))
    end
    local waiting = {}
    for _, w in ipairs(f.waiting) do waiting[w] = true end
    for j = first, first + n - 1 do
      local d = ARGV[j]
      if d == f.inflight or waiting[d] or (grid and f.hw and tonumber(d) <= f.hw) then
        before = before + 1  -- decided before
      elseif f.inflight == '' then
        start(d)
      elseif policy == 'C' then
        if run[#run] == f.inflight then  -- put in flight by this call: never enqueued
          run[#run] = nil
          skipped[#skipped + 1], blocking = f.inflight, d
          f.inflight, f.by = d, token
          run[#run + 1] = d
        else  -- cancelled wherever it is; the newest due time waits for it to end
          if f.replaced ~= f.inflight then
            cancel[#cancel + 1], f.replaced = f.inflight, f.inflight
          end
          for _, w in ipairs(f.waiting) do skipped[#skipped + 1], waiting[w] = w, nil end
          f.waiting, waiting[d], blocking = {d}, true, f.inflight
        end
      elseif (policy == '1' and #f.waiting == 0) or (policy == 'B' and #f.waiting < cap) then
        f.waiting[#f.waiting + 1], waiting[d] = d, true
      else
        skipped[#skipped + 1], blocking = d, f.inflight
      end
    end
    if grid and n > 0 then f.hw = math.max(f.hw or 0, tonumber(ARGV[first + n - 1])) end
    if ends and #f.waiting > 0 then park = string.format('%d', f.hw or 0) end
    put_flight(KEYS[1], id, f)
  end
  if #skipped > 0 then note_not_run(KEYS[2], id, #skipped, 'overlap', skipped[#skipped], blocking) end
  if m > 0 then note_not_run(KEYS[2], id, m, 'expired', ARGV[first + n + m - 1], '') end
  out[#out + 1] = {id, table.concat(run, ','), table.concat(cancel, ','),
    table.concat(skipped, ','), blocking, park, before}
end
return out
