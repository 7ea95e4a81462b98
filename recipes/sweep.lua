-- recipes/sweep.lua: measure a training recipe over a grid of its options,
-- each point a short run in a fresh process; a table, a CSV and a chart.
--
--   fsdp-lua recipes/sweep.lua                       the grid below on a small Llama
--   fsdp-lua recipes/sweep.lua --grid='dtype=f32,bf16 batch_size=2,4,8' --steps=5
--   fsdp-lua recipes/sweep.lua --memory_limit_mb=64  points past 64 MiB are reported as OOM
--   fsdp-lua recipes/sweep.lua --find_batch --memory_limit_mb=64
--                                                    the largest batch that fits, per point:
--                                                    planned first (the recipe's --plan), then
--                                                    verified by real steps (two probes when right)
--
-- An axis is any option of the recipe (see `fsdp-lua recipes/llama2_7b.lua
-- --help`), so `sharding_strategy=FULL_SHARD,SHARD_GRAD_OP` works as soon
-- as the recipe has that option. Each point runs the recipe with --args,
-- the point's options and --summary for --steps measured steps after one
-- warmup step; out-of-memory (under --memory_limit_mb) and other failures
-- are recorded and the sweep goes on. Results: the table on stdout and
-- <out>/sweep.csv, <out>/sweep.png (samples/s and peak MiB per point,
-- drawn by gnuplot; <out>/sweep.gp re-draws it).
local options = require 'fsdp.options'
local sweep = require 'fsdp.sweep'
local clock = require 'fsdp.clock'

local cfg = options.config({
  recipe = { 'recipes/llama2_7b.lua', 'the recipe to run at each point' },
  grid = { 'dtype=f32,bf16 activation_checkpointing=false,true batch_size=2,8',
           'axes "key=v1,v2 key2=..." over the recipe\'s options',
           check = function(v)
             local ok, err = pcall(sweep.parse_grid, v)
             if not ok then return 'is not a grid: ' .. tostring(err):gsub('^fsdp%.sweep: ', '') end
           end },
  args = { '--num_layers=2 --hidden_width=128 --num_heads=4 --vocab_size=512 --seq_len=128',
           'recipe options common to every point (the model)' },
  steps = { 3, 'measured steps per point (after one warmup step)', int = true, min = 1 },
  memory_limit_mb = { 0, 'memory limit of every point in MiB, on the recipe\'s --device (0: none)', min = 0 },
  timeout = { 600, 'seconds a point may run before it is recorded as a timeout', positive = true },
  out = { 'sweep_out', 'directory for sweep.csv and sweep.png', output = 'dir' },
  chart = { true, 'draw sweep.png with gnuplot' },
  find_batch = { false, 'instead of timing: the largest batch_size that fits under --memory_limit_mb, per point',
                 needs = 'memory_limit_mb' },
  plan_first = { true, '--find_batch: start from the planner\'s answer (the recipe\'s --plan), then verify by real steps' },
  max_batch = { 1024, 'upper bound of --find_batch', int = true, min = 1 },
}, arg, 'recipes/sweep.lua')

local function fail(msg)
  io.stderr:write('fsdp-lua: recipes/sweep.lua: ', msg, '\n')
  os.exit(2)
end

local ok, axes = pcall(sweep.parse_grid, cfg.grid)
if not ok then fail(axes) end
local base_args = {}
for a in cfg.args:gmatch('%S+') do base_args[#base_args + 1] = a end
-- Paths are relative to the project root when not found from here.
local host = require 'fsdp.host'
local function exists(path)
  local ok, is = pcall(require('fsdp.io.files').is_file, path)
  if not ok then fail('--recipe: ' .. is) end -- a FIFO, a device
  return is
end
local recipe_path = cfg.recipe
if not exists(recipe_path) and host.root and exists(host.root .. '/' .. recipe_path) then
  recipe_path = host.root .. '/' .. recipe_path
end
if not exists(recipe_path) then fail(('recipe %s not found'):format(cfg.recipe)) end

local opts = { recipe = recipe_path, axes = axes, args = base_args, steps = cfg.steps,
               memory_limit_mb = cfg.memory_limit_mb, timeout = cfg.timeout, max_batch = cfg.max_batch }
local t0 = clock.now()

-- Every point's options are checked before any point runs: a bad value or
-- an unknown option is found in seconds, not after the points before it.
-- (--find_batch checks its points at batch_size 1.)
do
  local check_axes, check_points = axes, sweep.points(axes)
  if cfg.find_batch then
    check_axes = {}
    for _, a in ipairs(axes) do if a.name ~= 'batch_size' then check_axes[#check_axes + 1] = a end end
    check_axes[#check_axes + 1] = { name = 'batch_size', values = { '1' } }
    check_points = sweep.points(check_axes)
  end
  local problems = sweep.validate(opts, check_points, check_axes)
  if #problems > 0 then
    for _, p in ipairs(problems) do
      io.stderr:write(('fsdp-lua: recipes/sweep.lua: grid point %d of %d (%s): %s%s\n'):format(p.index, #check_points,
        sweep.label(p.point, check_axes), p.message,
        p.count > 1 and (' (and %d more point%s)'):format(p.count - 1, p.count == 2 and '' or 's') or ''))
    end
    os.exit(2)
  end
end

if cfg.find_batch then
  local rest = {}
  for _, a in ipairs(axes) do if a.name ~= 'batch_size' then rest[#rest + 1] = a end end
  local points = #rest > 0 and sweep.points(rest) or { {} }
  local failures = 0
  print(('find_batch: %d point(s), limit %d MiB, batch up to %d'):format(#points, cfg.memory_limit_mb, cfg.max_batch))
  for _, point in ipairs(points) do
    opts.on_probe = function(b, r)
      print(('  %s batch_size=%d: %s'):format(sweep.label(point, rest), b, r.status))
    end
    opts.start = nil
    if cfg.plan_first then
      local planned, why = sweep.plan_point(opts, point, rest)
      if planned and planned.max_batch then
        print(('  %s: planned largest batch_size %d (fsdp.plan)'):format(sweep.label(point, rest), planned.max_batch))
        opts.start = math.max(1, planned.max_batch)
      else
        print(('  %s: no plan (%s); probing from 1'):format(sweep.label(point, rest), tostring(why or 'no max_batch')))
      end
    end
    local found, err_or_best = nil, nil
    ok, found, _, err_or_best = pcall(sweep.find_batch, opts, point, rest)
    if not ok then
      failures = failures + 1
      print(('%s: %s'):format(sweep.label(point, rest), tostring(found)))
    else
      print(('%s: largest batch_size that fits: %d%s'):format(sweep.label(point, rest), found,
        err_or_best and ('  (peak %.1f MiB)'):format(err_or_best.peak_bytes / 2^20) or ''))
    end
  end
  print(('find_batch took %.1f s'):format(clock.now() - t0))
  if failures > 0 then
    io.stderr:write(('fsdp-lua: recipes/sweep.lua: %d of %d point(s) failed\n'):format(failures, #points))
    os.exit(1)
  end
  return
end

local n = #sweep.points(axes)
print(('sweep: %d points of %s %s, %d measured steps each'):format(n, cfg.recipe, cfg.args, cfg.steps))
opts.on_result = function(i, total, r)
  print(('[%d/%d] %s: %s%s'):format(i, total, sweep.label(r.point, axes), r.status,
    r.status == 'ok' and (' %.2f samples/s, peak %.1f MiB'):format(r.samples_per_s, r.peak_bytes / 2^20)
      or ' (' .. tostring(r.message) .. ')'))
  io.stdout:flush()
end
local results = sweep.run(opts)
print('')
print(sweep.table(axes, results))

require('fsdp.io.files').mkdir_p(cfg.out, '--out')
local csv = cfg.out .. '/sweep.csv'
sweep.write_csv(csv, axes, results)
print(('\nwrote %s'):format(csv))
if cfg.chart then
  local png = cfg.out .. '/sweep.png'
  local drawn, why = sweep.write_chart(png, axes, results,
    { title = ('%s %s'):format(cfg.recipe, cfg.args), limit_mb = cfg.memory_limit_mb })
  if drawn then print(('wrote %s'):format(png)) else print(('no chart: %s'):format(why)) end
end
print(('sweep took %.1f s'):format(clock.now() - t0))
-- Exit status: a point that failed (an error or a timeout, not out of
-- memory under a limit, which is a measurement) fails the sweep.
local failed = 0
for _, r in ipairs(results) do if sweep.failed(r) then failed = failed + 1 end end
if failed > 0 then
  io.stderr:write(('fsdp-lua: recipes/sweep.lua: %d of %d points failed (see the table)\n'):format(failed, #results))
  os.exit(1)
end
