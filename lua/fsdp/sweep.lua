-- fsdp.sweep: run a recipe over a grid of options, each point in a fresh
-- process, and report throughput and peak memory (recipes/sweep.lua is the
-- command line).
--
--   local sweep = require 'fsdp.sweep'
--   local axes = sweep.parse_grid('dtype=f32,bf16 activation_checkpointing=false,true batch_size=2,4')
--   local results = sweep.run({ recipe = 'recipes/llama2_7b.lua', axes = axes,
--                               args = {'--num_layers=2'}, steps = 3 })
--   print(sweep.table(axes, results)); sweep.write_csv('out.csv', axes, results)
--
-- An axis is any option of the recipe (`--key=value`), so a new recipe
-- option (a sharding strategy) is a new axis without changes here. Each
-- point runs `fsdp-lua <recipe> <args> --key=value ... --summary` as its own
-- process: no allocator cache, collector state, memory statistics or
-- process group carries from one point to the next, and a point that
-- crashes cannot take the sweep with it. The recipe's last line
-- `SUMMARY {json}` gives samples/s, TFLOPS and peak bytes; a point that
-- fails is recorded as 'oom' (its output says "out of memory"), 'timeout'
-- or 'error' (with the message), and the sweep goes on. Before any point
-- runs, M.validate checks every point's options (recipes/sweep.lua refuses
-- a grid with a bad point), and a sweep with a failed point exits non-zero.
local quote = require 'fsdp.quote'
local progress = require 'fsdp.observe.progress'
local files = require 'fsdp.io.files'

local M = {}

local function fail(msg) error('fsdp.sweep: ' .. msg, 0) end

local function trim(s) return (s:gsub('^%s+', ''):gsub('%s+$', '')) end

-- "a=1,2 b=x,y" (axes separated by blanks or ';') -> {{name='a', values={'1','2'}}, ...}
-- Values stay strings: the recipe types them by its own defaults.
function M.parse_grid(text)
  if type(text) ~= 'string' then fail('grid must be a string like "dtype=f32,bf16 batch_size=2,4"') end
  local axes, seen = {}, {}
  for item in text:gmatch('[^%s;]+') do
    local name, list = item:match('^%-*([%w_%-]+)=(.*)$')
    if not name or list == '' then
      fail(('bad grid axis %q: expected key=value1,value2,...'):format(item))
    end
    name = name:gsub('%-', '_')
    if seen[name] then fail(('grid axis %s is given twice'):format(name)) end
    seen[name] = true
    local values = {}
    for v in (list .. ','):gmatch('([^,]*),') do
      if trim(v) == '' then fail(('grid axis %s has an empty value in %q'):format(name, list)) end
      values[#values + 1] = trim(v)
    end
    axes[#axes + 1] = { name = name, values = values }
  end
  if #axes == 0 then fail('the grid has no axes') end
  return axes
end

-- Every combination of the axes' values, the last axis varying fastest:
-- a list of points, each {name = value} with the axis order kept in axes.
function M.points(axes)
  local points = { {} }
  for _, axis in ipairs(axes) do
    local grown = {}
    for _, p in ipairs(points) do
      for _, v in ipairs(axis.values) do
        local q = {}
        for k, x in pairs(p) do q[k] = x end
        q[axis.name] = v
        grown[#grown + 1] = q
      end
    end
    points = grown
  end
  return points
end

-- The outcome of one run's output and exit status.
function M.classify(output, rc)
  local summary = output:match('\nSUMMARY (%b{})') or output:match('^SUMMARY (%b{})')
  if rc == 0 and summary then
    local ok, data = pcall(require('cjson').decode, summary)
    if ok and type(data) == 'table' then
      return { status = 'ok', samples_per_s = data.samples_per_s, tflops = data.tflops,
               peak_bytes = data.peak_bytes, step_seconds = data.step_seconds }
    end
    return { status = 'error', message = 'unreadable SUMMARY line: ' .. summary }
  end
  if rc == 124 or rc == 137 then return { status = 'timeout', message = 'ran past the time limit' } end
  local oom = output:match('(out of memory[^\n]*)')
  if oom then return { status = 'oom', message = oom } end
  if rc == 0 then return { status = 'error', message = 'no SUMMARY line in the output' } end
  local message = output:match('fsdp%-lua: ([^\n]*)') or trim(output):match('([^\n]*)$') or ''
  return { status = 'error', message = ('exit %d: %s'):format(rc, message) }
end

-- The words of one point's command: the recipe with the base arguments,
-- the point's options, and the measuring options last so they win (then
-- `extra`, e.g. '--plan'). fsdp.quote.capture runs them; M.command is
-- the line as the shell gets it.
function M.words(opts, point, axes, extra)
  local host = require 'fsdp.host'
  local words = { 'timeout', '-k', '5', tostring(opts.timeout or 600), opts.exe or host.exe, opts.recipe }
  for _, a in ipairs(opts.args or {}) do words[#words + 1] = a end
  for _, axis in ipairs(axes) do words[#words + 1] = ('--%s=%s'):format(axis.name, point[axis.name]) end
  local steps = (opts.steps or 3) + 1  -- one warmup step, left out of the rates
  -- --skip_fit_check: a point measures what really happens, out of
  -- memory included, rather than the planner's prediction.
  for _, w in ipairs({ ('--max_steps=%d'):format(steps), '--warmup_steps=0', ('--log_every=%d'):format(steps),
                       '--summary', '--skip_fit_check' }) do
    words[#words + 1] = w
  end
  if (opts.memory_limit_mb or 0) > 0 then words[#words + 1] = ('--memory_limit_mb=%s'):format(opts.memory_limit_mb) end
  if extra then words[#words + 1] = extra end
  return words
end

function M.command(opts, point, axes, extra) return quote.command(M.words(opts, point, axes, extra)) end

local function capture(words) return quote.capture(words) end

-- The planner's answer for a point: the recipe run with --plan (nothing
-- is trained or allocated) prints `PLAN {json}`; with a memory limit that
-- has max_batch, the largest batch it predicts fits. Returns the decoded
-- table, or nil and why (a recipe without --plan, say).
function M.plan_point(opts, point, axes)
  local output, rc = capture(M.words(opts, point, axes, '--plan'))
  local line = output:match('\nPLAN (%b{})') or output:match('^PLAN (%b{})')
  if rc ~= 0 or not line then
    local why = output:match('fsdp%-lua: ([^\n]*)') or ('exit %d, no PLAN line'):format(rc)
    return nil, why
  end
  local ok, data = pcall(require('cjson').decode, line)
  if not ok or type(data) ~= 'table' then return nil, 'unreadable PLAN line: ' .. line end
  return data
end

-- Run one point in a fresh process; the result has the point, status and
-- the measurements (or a message).
function M.run_point(opts, point, axes)
  local output, rc = capture(M.words(opts, point, axes))
  local result = M.classify(output, rc)
  result.point, result.command = point, M.command(opts, point, axes)
  return result
end

-- Check every point's options before any point runs: the recipe run with
-- the point's whole command line and --validate_options (fsdp.options:
-- the options and the model config they make are checked, nothing is
-- built; ~50 ms a point). Returns a list of problems {index=, point=,
-- message=, count=}, one per distinct message (an unknown option fails
-- every point alike: count says how many), empty when all are valid.
function M.validate(opts, points, axes)
  local problems, by_message = {}, {}
  local bar = progress.start('sweep: checking the options', { total = #points, unit = 'points' })
  for i, point in ipairs(points) do
    local output, rc = capture(M.words(opts, point, axes, '--validate_options'))
    bar:add(1)
    if rc ~= 0 or not output:find('options: ok', 1, true) then
      local message = output:match('fsdp%-lua: ([^\n]*)') or trim(output):match('([^\n]*)$') or ''
      if rc == 124 or rc == 137 then message = 'checking its options ran past the time limit' end
      if message == '' then message = ('exit %d'):format(rc) end
      local seen = by_message[message]
      if seen then
        seen.count = seen.count + 1
      else
        by_message[message] = { index = i, point = point, message = message, count = 1 }
        problems[#problems + 1] = by_message[message]
      end
    end
  end
  bar:finish()
  return problems
end

-- Whether a result is a failure of the point (its options, a crash, a
-- timeout) rather than a measurement: 'oom' under a memory limit is an
-- answer the sweep asks for.
function M.failed(result) return result.status == 'error' or result.status == 'timeout' end

-- Run every point of the grid in turn. opts: recipe, axes, args (base
-- arguments), steps (measured steps per point), memory_limit_mb, timeout
-- (seconds per point), exe, on_result(i, n, result) after each point.
function M.run(opts)
  if type(opts.recipe) ~= 'string' then fail('run: opts.recipe must be the path of a recipe') end
  local ok, is = pcall(files.is_file, opts.recipe)
  if not ok then fail(is) end
  if not is then fail(('recipe %s not found'):format(opts.recipe)) end
  local points = M.points(opts.axes)
  local results = {}
  local bar = progress.start(('sweep of %s'):format(opts.recipe), { total = #points, unit = 'points' })
  for i, point in ipairs(points) do
    results[i] = M.run_point(opts, point, opts.axes)
    bar:hide() -- on_result prints its line above the bar
    if opts.on_result then opts.on_result(i, #points, results[i]) end
    bar:show()
    bar:add(1)
  end
  bar:finish()
  return results
end

-- The largest batch size (1 ... opts.max_batch) whose real training steps
-- fit, each probe two steps in a fresh process (the second is the steady
-- state: optimizer state and the previous gradients exist; a first step
-- alone fits batches the second does not): doubling until a failure, then
-- bisecting. opts.start seeds the first probe (the planner's answer: then
-- start + 1 is probed next, and two probes settle a right plan).
-- Returns the batch (0 when even 1 fails), the probes {batch, status} in
-- order, and the last successful result.
function M.find_batch(opts, point, axes)
  local max_batch = opts.max_batch or 4096
  local probes, best_result = {}, nil
  local probe_opts = {}
  for k, v in pairs(opts) do probe_opts[k] = v end
  probe_opts.steps = 1  -- two steps: a warmup step and the steady one
  local probe_axes = {}
  for _, a in ipairs(axes) do probe_axes[#probe_axes + 1] = a end
  probe_axes[#probe_axes + 1] = { name = 'batch_size' }
  local function fits(b)
    local p = {}
    for k, v in pairs(point) do p[k] = v end
    p.batch_size = tostring(b)
    local r = M.run_point(probe_opts, p, probe_axes)
    probes[#probes + 1] = { batch = b, status = r.status, message = r.message }
    if opts.on_probe then opts.on_probe(b, r) end
    if r.status == 'error' or r.status == 'timeout' then
      fail(('batch %d failed with %s, not out of memory: %s'):format(b, r.status, r.message or ''))
    end
    if r.status == 'ok' then best_result = r end
    return r.status == 'ok'
  end
  local lo, hi = 0, nil           -- lo fits (0: none yet), hi fails
  local b = math.max(1, math.min(opts.start or 1, max_batch))
  local planned = opts.start ~= nil
  while true do
    if fits(b) then
      lo = b
      if b >= max_batch then return lo, probes, best_result end
      -- After a planned start its neighbour; then doubling.
      b = planned and b + 1 or math.min(b * 2, max_batch)
      planned = false
    else
      hi = b
      break
    end
  end
  if lo == 0 and hi > 1 then
    -- The seed was too big: search below it.
    local l = 0
    while hi - l > 1 do
      local mid = math.floor((l + hi) / 2)
      if fits(mid) then l = mid else hi = mid end
    end
    return l, probes, best_result
  end
  while hi - lo > 1 do
    local mid = math.floor((lo + hi) / 2)
    if fits(mid) then lo = mid else hi = mid end
  end
  return lo, probes, best_result
end

-- reports ------------------------------------------------------------------

local function mib(bytes) return bytes and ('%.1f'):format(bytes / 2^20) or '' end
local function num(x, fmt) return x and (fmt):format(x) or '' end

-- A short label of a point: "f32 ckpt=true bs=2" style, from the axes.
function M.label(point, axes)
  local parts = {}
  for _, axis in ipairs(axes) do parts[#parts + 1] = ('%s=%s'):format(axis.name, point[axis.name]) end
  return table.concat(parts, ' ')
end

-- The values of a point alone, "f32/true/2", for chart ticks.
function M.short_label(point, axes)
  local parts = {}
  for _, axis in ipairs(axes) do parts[#parts + 1] = tostring(point[axis.name]) end
  return table.concat(parts, '/')
end

-- The printed table of results.
function M.table(axes, results)
  local header = { '#' }
  for _, a in ipairs(axes) do header[#header + 1] = a.name end
  for _, h in ipairs { 'status', 'samples/s', 'TFLOPS', 'peak MiB', 'note' } do header[#header + 1] = h end
  local rows = {}
  for i, r in ipairs(results) do
    local row = { tostring(i) }
    for _, a in ipairs(axes) do row[#row + 1] = r.point[a.name] end
    row[#row + 1] = r.status
    row[#row + 1] = num(r.samples_per_s, '%.2f')
    row[#row + 1] = num(r.tflops, '%.4f')
    row[#row + 1] = mib(r.peak_bytes)
    local note = r.message or ''
    if #note > 60 then note = note:sub(1, 57) .. '...' end
    row[#row + 1] = note
    rows[#rows + 1] = row
  end
  local widths = {}
  for c = 1, #header do
    widths[c] = #header[c]
    for _, row in ipairs(rows) do widths[c] = math.max(widths[c], #row[c]) end
  end
  local function render(cells)
    local out = {}
    for c, cell in ipairs(cells) do out[c] = cell .. (' '):rep(widths[c] - #cell) end
    return (table.concat(out, '  '):gsub('%s+$', ''))
  end
  local lines = { render(header) }
  local rule = {}
  for c = 1, #header do rule[c] = ('-'):rep(widths[c]) end
  lines[#lines + 1] = render(rule)
  for _, row in ipairs(rows) do lines[#lines + 1] = render(row) end
  return table.concat(lines, '\n')
end

local function csv_field(s)
  s = tostring(s or '')
  if s:find('[,"\n]') then s = '"' .. s:gsub('"', '""') .. '"' end
  return s
end
M.csv_field = csv_field

-- One row per point: the axes, status, samples_per_s, tflops, peak_bytes,
-- peak_mib, message.
function M.write_csv(path, axes, results)
  local f, err = files.open_output(path)
  if not f then fail(('cannot write %s: %s'):format(path, err)) end
  local header = {}
  for _, a in ipairs(axes) do header[#header + 1] = csv_field(a.name) end
  for _, h in ipairs { 'status', 'samples_per_s', 'tflops', 'peak_bytes', 'peak_mib', 'message' } do
    header[#header + 1] = h
  end
  f:write(table.concat(header, ','), '\n')
  for _, r in ipairs(results) do
    local row = {}
    for _, a in ipairs(axes) do row[#row + 1] = csv_field(r.point[a.name]) end
    row[#row + 1] = r.status
    row[#row + 1] = num(r.samples_per_s, '%.6g')
    row[#row + 1] = num(r.tflops, '%.6g')
    row[#row + 1] = r.peak_bytes and ('%d'):format(r.peak_bytes) or ''
    row[#row + 1] = mib(r.peak_bytes)
    row[#row + 1] = csv_field(r.message)
    f:write(table.concat(row, ','), '\n')
  end
  f:close()
end

-- A PNG with two bar charts over the points, throughput (samples/s) and
-- peak memory (MiB), drawn by gnuplot; failed points show their status in
-- place of a bar, and opts.limit_mb (a memory limit) is a line. Writes
-- <base>.dat and <base>.gp (to re-plot by hand) next to the image. Paths,
-- the title and the axis names are written by fsdp.quote.gnuplot, so
-- neither a file name nor a recipe's arguments run anything. Returns
-- true, or nil and why.
function M.write_chart(png, axes, results, opts)
  opts = opts or {}
  local base = png:gsub('%.png$', '')
  local dat, gp = base .. '.dat', base .. '.gp'
  local quotable, why = pcall(quote.gnuplot, base)
  if not quotable then return nil, why end
  local q = quote.gnuplot
  -- what gnuplot writes is checked too: a FIFO there would block it
  local writable, why2 = files.check_output(png)
  if not writable then return nil, why2 end
  local f, err = files.open_output(dat)
  if not f then return nil, ('cannot write %s: %s'):format(dat, err) end
  f:write('# index label samples_per_s peak_mib status\n')
  for i, r in ipairs(results) do
    -- a data file's "strings" are never expanded; a quote or a line break
    -- would only end the field or the row early
    local label = M.short_label(r.point, axes):gsub('["%c]', "'")
    f:write(('%d "%s" %s %s "%s"\n'):format(i, label, num(r.samples_per_s, '%.6g'):gsub('^$', '0'),
      mib(r.peak_bytes):gsub('^$', '0'), r.status == 'ok' and '' or r.status:upper()))
  end
  f:close()
  local names = {}
  for _, a in ipairs(axes) do names[#names + 1] = a.name end
  local top = opts.limit_mb or 0
  for _, r in ipairs(results) do top = math.max(top, (r.peak_bytes or 0) / 2^20) end
  local limit = (opts.limit_mb or 0) > 0 and
    ("set arrow from graph 0, first %g to graph 1, first %g nohead dashtype 2 lc rgb 'red'\n" ..
     "set label 'limit %g MiB' at graph 0.01, first %g offset 0,0.6 textcolor rgb 'red'")
      :format(opts.limit_mb, opts.limit_mb, opts.limit_mb, opts.limit_mb) or ''
  local labels = "'' using 1:(0):5 with labels offset 0,1 textcolor rgb 'red' notitle"
  local script = {
    "set terminal pngcairo size 1000,800 font ',9' noenhanced",
    'set output ' .. q(png),
    'set multiplot layout 2,1 title ' .. quote.gnuplot(opts.title or 'sweep'),
    'set style fill solid 0.6 border -1',
    'set boxwidth 0.6',
    'set grid ytics',
    'set xtics rotate by 20 right',
    'set yrange [0:*]',
    ('set xrange [0.3:%f]'):format(#results + 0.7),
    "set ylabel 'samples/s'",
    ('plot %s using 1:3:xtic(2) with boxes notitle, %s'):format(q(dat), labels),
    'set xlabel ' .. quote.gnuplot(table.concat(names, ' / ')),
    "set ylabel 'peak memory (MiB)'",
    ('set yrange [0:%g]'):format(top > 0 and top * 1.15 or 1),
    limit,
    ("plot %s using 1:4:xtic(2) with boxes lc rgb '#c06000' notitle, %s"):format(q(dat), labels),
    'unset multiplot',
  }
  f, err = files.open_output(gp)
  if not f then return nil, ('cannot write %s: %s'):format(gp, err) end
  f:write(table.concat(script, '\n'), '\n')
  f:close()
  local out, rc = capture({ 'gnuplot', gp })
  if rc == 127 then return nil, 'gnuplot is not installed (Debian: apt-get install gnuplot-nox)' end
  if rc ~= 0 then return nil, ('gnuplot failed (exit %d): %s'):format(rc, trim(out)) end
  return true
end

return M
