-- tools/trace_summary.lua: what the traces of --profile_steps say, as text:
-- per rank the time of the traced steps, the spans that took the most time
-- of their own (children subtracted: a layer's forward without its
-- sublayers'), and the exposed communication (time the host waited on
-- all-gathers and reduce-scatters, which compute did not hide), and the
-- peak of the memory counter with the spans it happened in and what held
-- it (persistent, gathered units, activations and transients); on a GPU
-- also the ops that took the most device time (the trace's device track,
-- fsdp.observe.profiler's [Note: device time]).
--
--   fsdp-lua tools/trace_summary.lua profile/trace-rank0.json
--   fsdp-lua tools/trace_summary.lua profile/trace-rank*.json --top=20 --merge=profile/all.json
--
-- --merge writes the ranks' events into one Chrome/Perfetto trace (one
-- process track per rank).
local options = require 'fsdp.options'
local json = require 'fsdp.io.json'
local files = require 'fsdp.io.files'

local cfg, paths = options.config({
  top = { 15, 'spans to list, by their own time', int = true, min = 1 },
  merge = { '', 'also write all the files\' events into this one trace', output = 'file' },
}, arg, 'tools/trace_summary.lua', nil, { positional = 'TRACE.json ...' })
if #paths == 0 then options.usage_error('tools/trace_summary.lua: give one or more trace files (--profile_steps)') end

local function fail(msg)
  io.stderr:write('fsdp-lua: tools/trace_summary.lua: ', msg, '\n')
  os.exit(1)
end

local all = {}
local by_rank, ranks, peaks, owners, device_ops = {}, {}, {}, {}, {}
for _, path in ipairs(paths) do
  local text, err = files.read(path, files.LIMITS.log[1], 'a trace')
  if not text then fail(err) end
  local ok, t = pcall(json.decode, text)
  if not ok or type(t) ~= 'table' or type(t.traceEvents) ~= 'table' then
    fail(('%s is not a Chrome trace (a JSON object with traceEvents)'):format(path))
  end
  for _, e in ipairs(t.traceEvents) do
    all[#all + 1] = e
    if e.ph == 'C' and e.args and type(e.args.in_use_mib) == 'number' then
      local p = peaks[e.pid]
      if not p or e.args.in_use_mib > p.mib then peaks[e.pid] = { mib = e.args.in_use_mib, ts = e.ts, name = e.name } end
    end
    -- the same sample split by owner (profiler.lua, [Note: memory by owner])
    if e.ph == 'C' and e.args and type(e.args.persistent) == 'number' then
      owners[e.pid] = owners[e.pid] or {}
      owners[e.pid][e.ts] = e.args
    end
    if e.ph == 'X' and e.cat == 'device' then
      device_ops[e.pid] = device_ops[e.pid] or {}
      table.insert(device_ops[e.pid], e)
    elseif e.ph == 'X' then
      local list = by_rank[e.pid]
      if not list then list = {}; by_rank[e.pid] = list; ranks[#ranks + 1] = e.pid end
      list[#list + 1] = e
    end
  end
end
table.sort(ranks)

-- Own time of every span: its duration less its direct children's (spans
-- of one thread nest; sorted by start, longer first on a tie).
local function own_times(list)
  table.sort(list, function(a, b) if a.ts ~= b.ts then return a.ts < b.ts end return a.dur > b.dur end)
  local stack = {}
  for _, e in ipairs(list) do
    e.own = e.dur
    while #stack > 0 and stack[#stack].ts + stack[#stack].dur <= e.ts do table.remove(stack) end
    if #stack > 0 then stack[#stack].own = stack[#stack].own - e.dur end
    stack[#stack + 1] = e
  end
end

local function ms(us) return ('%.3f'):format(us / 1000) end

for _, rank in ipairs(ranks) do
  local list = by_rank[rank]
  own_times(list)
  local step_time, steps, wait, comm = 0, 0, 0, 0
  local groups = {}
  for _, e in ipairs(list) do
    if e.cat == 'step' then step_time, steps = step_time + e.dur, steps + 1 end
    if e.cat == 'wait' then wait = wait + e.dur end
    if e.cat == 'comm' then comm = comm + e.dur end
    if e.cat ~= 'step' then
      local key = e.cat .. '\0' .. e.name
      local g = groups[key]
      if not g then g = { name = e.name, cat = e.cat, own = 0, total = 0, n = 0 }; groups[key] = g end
      g.own, g.total, g.n = g.own + e.own, g.total + e.dur, g.n + 1
    end
  end
  local sorted = {}
  for _, g in pairs(groups) do sorted[#sorted + 1] = g end
  table.sort(sorted, function(a, b) return a.own > b.own end)
  print(('rank %d: %d step%s traced, %s ms'):format(rank, steps, steps == 1 and '' or 's', ms(step_time)))
  print(('  %-10s %10s %10s %6s  %s'):format('category', 'own ms', 'total ms', 'calls', 'span'))
  for i = 1, math.min(cfg.top, #sorted) do
    local g = sorted[i]
    print(('  %-10s %10s %10s %6d  %s'):format(g.cat, ms(g.own), ms(g.total), g.n, g.name))
  end
  print(('  exposed communication: %s ms waiting on collectives (%.1f%% of the steps); %s ms starting them and freeing'):format(
    ms(wait), step_time > 0 and wait / step_time * 100 or 0, ms(comm)))
  if device_ops[rank] then
    local by_name, total = {}, 0
    for _, e in ipairs(device_ops[rank]) do
      local g = by_name[e.name] or { name = e.name, dur = 0, n = 0 }
      by_name[e.name] = g
      g.dur, g.n, total = g.dur + e.dur, g.n + 1, total + e.dur
    end
    local top = {}
    for _, g in pairs(by_name) do top[#top + 1] = g end
    table.sort(top, function(a, b) return a.dur > b.dur end)
    print(('  device time of the ops: %s ms in %d ops'):format(ms(total), #device_ops[rank]))
    for i = 1, math.min(cfg.top, #top) do
      print(('  %-10s %10s %10s %6d  %s'):format('device', ms(top[i].dur), '', top[i].n, top[i].name))
    end
  end
  -- the counter is sampled as each span ends: the peak's spans are the one
  -- that ended there and those around it, outermost first
  local p = peaks[rank]
  if p then
    local around = {}
    for _, e in ipairs(list) do
      if e.ts <= p.ts and p.ts <= e.ts + e.dur + 1 then around[#around + 1] = e end
    end
    table.sort(around, function(a, b) return a.dur > b.dur end)
    local chain = {}
    for _, e in ipairs(around) do chain[#chain + 1] = e.name end
    local split = ''
    local o = owners[rank] and owners[rank][p.ts]
    if o then
      split = (' (persistent %.1f, gathered units %.1f, activations and transients %.1f)'):format(
        o.persistent, o['gathered units'], o['activations and transients'])
    end
    print(('  peak %s in use: %.1f MiB%s, at the end of %s'):format(p.name:gsub('^memory ', ''), p.mib, split,
      #chain > 0 and table.concat(chain, ' > ') or '(no span)'))
  end
end

if cfg.merge ~= '' then
  local parts = {}
  for i, e in ipairs(all) do parts[i] = json.encode(e) end
  files.write_atomic(cfg.merge, '{"displayTimeUnit":"ms","traceEvents":[\n' .. table.concat(parts, ',\n') .. '\n]}\n')
  print(('merged %d files (%d events) into %s'):format(#paths, #all, cfg.merge))
end
