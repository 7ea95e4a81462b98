-- fsdp.observe.joined: communication time counted from the moment each
-- collective's last member joined it ([Note: joined time] in
-- core/dist/mpi/backend_mpi.c): the link's time, without the time a rank
-- waited for late peers, which is what fsdp.plan.cost predicts.
--
--   local joined = require 'fsdp.observe.joined'
--   local log = fsdp.dist.collective_log()          -- e.g. one step's
--   local t = joined.seconds(log)                   -- every rank calls
--   print(t.any, t.all_gather, t.skew)
--
-- seconds(log) is collective over the world (two all_gathers of the
-- ranks' logs, since any group's members are in it). For each of this
-- rank's records it takes the latest start among the collective's members
-- (records of other ranks with the same comm and sequence) and counts the
-- interval from there to this rank's completion; intervals of one kind,
-- and of any kind ('any'), are counted once where they overlap, as the
-- busy time of fsdp.dist.collective_stats is. `skew` sums, over this
-- rank's collectives, how long after its own start the last member came.
-- The log's records of the two gathers it ran are taken out of the next
-- log: seconds returns, second, what was logged meanwhile without them
-- (pass it on, with the next log appended, to the next call).
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local ffi, C = core.ffi, core.C

local M = {}

local KINDS = { all_gather = 0, reduce_scatter = 1, all_reduce = 2, broadcast = 3, barrier = 4 }
local FIELDS = 5 -- comm, kind, sequence, start, finish
local WORLD = 1  -- the world communicator's key

local function cpu_tensor(dtype, n)
  return Tensor.wrap(C.fl_empty(1, ffi.new('int64_t[1]', n), dtype, core.device('cpu')))
end

-- Seconds covered by intervals {a, b} (a <= b), overlaps counted once.
local function union_seconds(intervals)
  table.sort(intervals, function(x, y) return x[1] < y[1] end)
  local total, from, to = 0, nil, nil
  for _, iv in ipairs(intervals) do
    if not to or iv[1] > to then
      if to then total = total + (to - from) end
      from, to = iv[1], iv[2]
    elseif iv[2] > to then
      to = iv[2]
    end
  end
  if to then total = total + (to - from) end
  return total
end

-- The latest start of each collective among all ranks' records, by
-- "comm:sequence", from the world's gathered logs.
local function latest_starts(log)
  local dist = fsdp.dist
  local counts = dist.all_gather(cpu_tensor(C.FL_I64, 1):fill_(#log))
  local longest = 1
  for r = 0, dist.world_size() - 1 do longest = math.max(longest, counts:get(r)) end
  local mine = cpu_tensor(C.FL_F64, longest * FIELDS):fill_(0)
  local p = ffi.cast('double *', Tensor.cptr(mine).data)
  for i, rec in ipairs(log) do
    local kind = KINDS[rec.kind]
    if not kind then core.fail(('joined.seconds: record %d has unknown kind %s'):format(i, tostring(rec.kind))) end
    local row = p + (i - 1) * FIELDS
    row[0], row[1], row[2], row[3], row[4] = rec.comm, kind, rec.sequence, rec.start, rec.finish
  end
  local all = dist.all_gather(mine)
  local q, latest = ffi.cast('const double *', Tensor.cptr(all).data), {}
  for r = 0, dist.world_size() - 1 do
    for i = 0, counts:get(r) - 1 do
      local row = q + (r * longest + i) * FIELDS
      local key = ('%d:%d'):format(row[0], row[2])
      if not latest[key] or row[3] > latest[key] then latest[key] = row[3] end
    end
  end
  return latest
end

function M.seconds(log)
  local dist = fsdp.dist
  local result = { any = 0, skew = 0 }
  for kind in pairs(KINDS) do result[kind] = 0 end
  if dist.world_size() == 1 then return result, {} end
  local latest = latest_starts(log)
  local per_kind, all = {}, {}
  for _, rec in ipairs(log) do
    local from = math.max(rec.start, latest[('%d:%d'):format(rec.comm, rec.sequence)] or rec.start)
    result.skew = result.skew + (from - rec.start)
    if rec.finish > from then
      per_kind[rec.kind] = per_kind[rec.kind] or {}
      table.insert(per_kind[rec.kind], { from, rec.finish })
      all[#all + 1] = { from, rec.finish }
    end
  end
  for kind, intervals in pairs(per_kind) do result[kind] = union_seconds(intervals) end
  result.any = union_seconds(all)
  -- The two gathers were the last collectives this rank started on the
  -- world: its two highest world sequences among what was logged since.
  local since = dist.collective_log()
  local top1, top2 = -1, -1
  for _, rec in ipairs(since) do
    if rec.comm == WORLD then
      if rec.sequence > top1 then top1, top2 = rec.sequence, top1
      elseif rec.sequence > top2 then top2 = rec.sequence end
    end
  end
  local rest = {}
  for _, rec in ipairs(since) do
    if not (rec.comm == WORLD and (rec.sequence == top1 or rec.sequence == top2)) then rest[#rest + 1] = rec end
  end
  return result, rest
end

return M
