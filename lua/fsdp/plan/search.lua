-- fsdp.plan.search: which device mesh to train a model on for a cluster
-- (issue 43): every mesh of tensor parallelism x FSDP the cluster allows,
-- each planned (fsdp.plan), ranked.
--
--   local s = fsdp.plan.search(m, {world = 64, device = 'h100-80g', mixed_precision = 'bf16',
--                                  global_batch = 64, seq = 8192, checkpoint = true})
--   print(s)            -- one row per mesh, then the recommendation
--   s.best, s.rows[1].plan, s.rows[1].mesh
--
-- Meshes: tp in the divisors of the ranks per node (a TP group stays in a
-- node) for which the model's TP plan divides (heads, kv heads, FFN,
-- vocabulary: fsdp.tp checks them; a tp it refuses is listed in
-- s.skipped with its reason), the rest of the world data parallel as
--   FSDP  dp_shard = world / tp (shard over every data-parallel rank)
--   HSDP  dp_shard = ranks per node / tp, dp_replicate = nodes (shard in a
--         node, replicate across; only with several nodes)
-- and, for tp > 1, with and without sequence parallelism
-- (sequence_parallel = true | false | 'both', the default). The batch:
-- global_batch (sequences per step, split over the data-parallel ranks;
-- meshes it does not divide over are skipped) or batch (per data-parallel
-- rank, every mesh alike). Every other option is fsdp.plan's (world, nodes,
-- ranks_per_node, device, mixed_precision, checkpoint, optimizer, seq,
-- ...). Ranked: meshes that fit first, then the most tokens per second;
-- the recommendation is the first row that fits.
local core = require 'fsdp.core'
local devices = require 'fsdp.devices'
local dist = require 'fsdp.dist'

local M = {}

local Search = {}
Search.__index = Search
Search.__name = 'PlanSearch'

local WHO = 'fsdp.plan.search'
local function fail(fmt, ...) core.fail(WHO .. ': ' .. fmt:format(...)) end

local OWN = { global_batch = true, sequence_parallel = true, tp = true, dp_shard = true, dp_replicate = true,
              mesh = true, strategy = true }

-- world, nodes and ranks per node as fsdp.plan resolves them ([Note: plan
-- node size]), for enumerating.
local function cluster(opts)
  local dev = devices.get(opts.device or 'cpu', WHO .. ': device')
  local per = opts.ranks_per_node or (dev.ranks_per_node ~= 'all' and dev.ranks_per_node) or nil
  local world = opts.world
  if world == nil and opts.nodes ~= nil then world = opts.nodes * (per or 8) end
  world = world or dist.world_size()
  local nodes = opts.nodes
  if nodes == nil then
    per = math.min(per or world, world)
    nodes = world / per
  else
    per = world / nodes
  end
  if nodes ~= math.floor(nodes) then fail('world %d is not a multiple of %d ranks per node', world, per) end
  return world, nodes, per
end

local function label(row)
  local m = row.mesh
  local dp = m.dp_replicate > 1 and ('HSDP %d x %d'):format(m.dp_replicate, m.dp_shard)
    or ('FSDP %d'):format(m.dp_shard)
  if m.tp == 1 then return dp end
  return ('tp %d x %s%s'):format(m.tp, dp, row.sp and ' + SP' or '')
end
M.label = label

-- plan: fsdp.plan.plan, passed in by fsdp.plan (which requires this file).
function M.search(model, opts, plan)
  opts = opts or {}
  if type(opts) ~= 'table' then fail('expected an options table, got %s', type(opts)) end
  for _, k in ipairs({ 'tp', 'dp_shard', 'dp_replicate', 'mesh', 'strategy' }) do
    if opts[k] ~= nil then fail('%s is what the search chooses: leave it out', k) end
  end
  local world, nodes, per = cluster(opts)
  local sp_opt = opts.sequence_parallel
  if sp_opt == nil then sp_opt = 'both' end
  if sp_opt ~= true and sp_opt ~= false and sp_opt ~= 'both' then
    fail("sequence_parallel must be true, false or 'both', got %s", tostring(sp_opt))
  end
  local gb = opts.global_batch
  if gb ~= nil and (type(gb) ~= 'number' or gb < 1 or gb ~= math.floor(gb)) then
    fail('global_batch must be a positive integer, got %s', tostring(gb))
  end
  local base = {}
  for k, v in pairs(opts) do if not OWN[k] then base[k] = v end end
  base.world, base.nodes = world, nodes

  local rows, skipped = {}, {}
  for T = 1, per do
    if per % T == 0 then
      local meshes = { { dp_replicate = 1, dp_shard = world / T, tp = T } }
      if nodes > 1 then meshes[2] = { dp_replicate = nodes, dp_shard = per / T, tp = T } end
      local sps = T == 1 and { false } or (sp_opt == 'both' and { false, true } or { sp_opt })
      for _, mesh in ipairs(meshes) do
        local dp = mesh.dp_replicate * mesh.dp_shard
        local batch = opts.batch or 1
        local why
        if gb then
          if gb % dp ~= 0 then why = ('global_batch %d does not split over %d data-parallel ranks'):format(gb, dp) end
          batch = gb / dp
        end
        for _, sp in ipairs(sps) do
          local row = { mesh = mesh, sp = sp, batch = batch }
          row.label = label(row)
          if not why then
            local o = {}
            for k, v in pairs(base) do o[k] = v end
            o.tp, o.dp_shard, o.dp_replicate, o.sequence_parallel, o.batch = T, mesh.dp_shard, mesh.dp_replicate, sp,
              batch
            local ok, p = pcall(plan, model, o)
            if ok then
              row.plan = p
              rows[#rows + 1] = row
            elseif T > 1 and tostring(p):match('fsdp%.plan: tp = %d+: ') then
              why = (tostring(p):gsub('^.-fsdp%.plan: ', ''))
            else
              error(p, 0)
            end
          end
          if why then
            row.why = why
            skipped[#skipped + 1] = row
            break
          end
        end
      end
    end
  end
  table.sort(rows, function(a, b)
    if a.plan.fits ~= b.plan.fits then return a.plan.fits end
    if a.plan.time.tokens_per_s ~= b.plan.time.tokens_per_s then
      return a.plan.time.tokens_per_s > b.plan.time.tokens_per_s
    end
    return a.plan.memory.peak < b.plan.memory.peak
  end)
  local best = rows[1] and rows[1].plan.fits and rows[1] or nil
  return setmetatable({ rows = rows, skipped = skipped, best = best, world = world, nodes = nodes,
                        ranks_per_node = per, device = rows[1] and rows[1].plan.options.device.name or opts.device },
                      Search)
end

-- The table: one row per mesh, ranked, then the recommendation.
function Search.format(s)
  local L = {}
  local function line(fmt, ...) L[#L + 1] = fmt:format(...) end
  line('meshes for %d x %s (%d node%s of %d), ranked (fits first, then tokens/s):', s.world, tostring(s.device),
    s.nodes, s.nodes == 1 and '' or 's', s.ranks_per_node)
  line('  %-24s %6s %11s %5s %11s %12s %7s %11s %11s', 'mesh', 'batch', 'memory GiB', 'fits', 'step ms',
    'tokens/s', 'MFU', 'TP comm s', 'FSDP comm s')
  for _, row in ipairs(s.rows) do
    local p = row.plan
    line('  %-24s %6d %11.2f %5s %11.1f %12.0f %6.1f%% %11.3f %11.3f', row.label, row.batch, p.memory.peak / 2^30,
      p.fits and 'yes' or 'no', 1e3 * p.time.step, p.time.tokens_per_s, 100 * p.time.mfu, p.time.tp_comm or 0,
      p.time.comm)
  end
  for _, row in ipairs(s.skipped) do line('  %-24s skipped: %s', row.label, row.why) end
  if s.best then
    line('recommended: %s (batch %d per data-parallel rank): %.2f GiB per rank, %.3f s per step, MFU %.1f%%',
      s.best.label, s.best.batch, s.best.plan.memory.peak / 2^30, s.best.plan.time.step,
      100 * s.best.plan.time.mfu)
  else
    line('recommended: none: no mesh fits (try checkpoint = true, a smaller batch, or more ranks)')
  end
  return table.concat(L, '\n')
end
Search.__tostring = Search.format

return M
