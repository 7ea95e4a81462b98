-- fsdp.observe.joined: communication time counted from the moment each
-- collective's last member joined it ([Note: joined time] in
-- core/comm/mpi/backend_mpi.c): the link's time, without the time a rank
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
local ffi = require('fsdp.core').ffi

local M = {}

local KINDS = { 'all_gather', 'reduce_scatter', 'all_reduce', 'broadcast', 'barrier' }
local FIELDS = 3 -- what other ranks need of a record: comm, sequence, start
local WORLD = 1  -- the world communicator's key

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
-- "comm:sequence": the logs packed as doubles and gathered over the world
-- (fsdp.dist.all_gather_strings: the lengths, then the bytes).
local function latest_starts(log)
  local mine = ffi.new('double[?]', math.max(#log, 1) * FIELDS)
  for i, rec in ipairs(log) do
    local row = mine + (i - 1) * FIELDS
    row[0], row[1], row[2] = rec.comm, rec.sequence, rec.start
  end
  local latest = {}
  for _, packed in ipairs(fsdp.dist.all_gather_strings(ffi.string(mine, #log * FIELDS * 8))) do
    local q = ffi.cast('const double *', packed)
    for i = 0, #packed / (FIELDS * 8) - 1 do
      local row = q + i * FIELDS
      local key = ('%d:%d'):format(row[0], row[1])
      if not latest[key] or row[2] > latest[key] then latest[key] = row[2] end
    end
  end
  return latest
end

function M.seconds(log)
  local dist = fsdp.dist
  local result = { any = 0, skew = 0 }
  for _, kind in ipairs(KINDS) do result[kind] = 0 end
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
