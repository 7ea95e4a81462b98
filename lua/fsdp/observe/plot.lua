-- fsdp.observe.plot: the curves of one or more runs' metrics JSONL files
-- (fsdp.metrics) drawn by gnuplot, no server needed: training and
-- validation loss, learning rate, tokens/s and peak memory against the
-- step, each run a coloured line with its name in the legend. Used by
-- tools/plot.lua and by the recipes' --plot.
--
--   local plot = require 'fsdp.observe.plot'
--   local paths = plot.draw({ 'logs/a.jsonl', 'logs/b.jsonl' }, 'logs/a')  -- logs/a.png, logs/a.svg
--
-- Beside the images go <base>.gp (the gnuplot script, to re-plot by hand)
-- and one <base>.<n>.dat per run: its training steps (step loss lr
-- tokens_per_sec peak_mib; '?' where a record lacks one), then two blank
-- lines and its validation steps (step loss) — what gnuplot was given.
-- A step written more than once (an old file from before resumes dropped
-- records) counts with its last record. Every path and name in the script
-- is written by fsdp.quote.gnuplot ([Note: quoting for sh and gnuplot]),
-- so a file name runs nothing.
local json = require 'fsdp.io.json'
local files = require 'fsdp.io.files'
local quote = require 'fsdp.quote'

local M = {}

local function fail(msg) error('fsdp.plot: ' .. msg, 0) end

-- A file the plot is made of, whole or not at all, checked (a failed
-- write names the file and why).
local function write(path, text)
  local ok, err = pcall(files.write_atomic, path, text)
  if not ok then fail(tostring(err):gsub('^[^%s:]+:%d+: ', '')) end
end

-- The records of a metrics file: { train = {records by step order}, val = {...} }.
function M.read(path)
  local text, err = files.read(path, files.LIMITS.log[1], 'a metrics file')
  if not text then fail(err) end
  local by = { train = {}, val = {} }
  local n = 0
  for line in text:gmatch('[^\n]+') do
    n = n + 1
    local ok, r = pcall(json.decode, line)
    if not ok or type(r) ~= 'table' then fail(('%s:%d: not a JSON object: %s'):format(path, n, line:sub(1, 80))) end
    if by[r.type] and type(r.step) == 'number' then by[r.type][r.step] = r end
  end
  local out = {}
  for kind, steps in pairs(by) do
    local list = {}
    for _, r in pairs(steps) do list[#list + 1] = r end
    table.sort(list, function(a, b) return a.step < b.step end)
    out[kind] = list
  end
  if #out.train == 0 and #out.val == 0 then fail(('%s has no training or validation records'):format(path)) end
  return out
end

local function num(x, scale)
  if type(x) ~= 'number' or x ~= x then return '?' end
  return ('%.9g'):format(x / (scale or 1))
end

-- The data file of one run (see the header); returns its text and which
-- of its columns hold a number somewhere ({[2] = true, ..., val = true}):
-- gnuplot refuses a plot whose every series is empty.
function M.data_text(run)
  local lines, has = { '# step loss lr tokens_per_sec peak_mib' }, {}
  for _, r in ipairs(run.train) do
    local row = { ('%d'):format(r.step), num(r.loss), num(r.lr), num(r.tokens_per_sec),
                  num(r.peak_memory_bytes, 2 ^ 20) }
    for col = 2, #row do has[col] = has[col] or row[col] ~= '?' end
    lines[#lines + 1] = table.concat(row, ' ')
  end
  -- gnuplot wants a point in every index block: an undefined one for none
  lines[#lines + 1] = '\n\n# step val_loss'
  if #run.val == 0 then lines[#lines + 1] = '0 ?' end
  for _, r in ipairs(run.val) do
    lines[#lines + 1] = ('%d %s'):format(r.step, num(r.loss))
    has.val = has.val or num(r.loss) ~= '?'
  end
  return table.concat(lines, '\n') .. '\n', has
end

local function name_of(path) return (path:match('([^/]+)$'):gsub('%.jsonl$', '')) end

-- The gnuplot commands that draw the runs (data files `dats`, legend
-- names `names`, columns present `has`) on the current terminal. A panel
-- whose numbers no run logged (tokens/s of a recipe without tokens) says
-- so instead of failing the plot.
local function panels(dats, names, has)
  local function series(col, parts)
    for i, dat in ipairs(dats) do
      if has[i][col] then
        parts[#parts + 1] = ('%s index 0 using 1:%d with lines lw 1.5 lc %d title %s'):format(quote.gnuplot(dat), col,
          i, quote.gnuplot(names[i]))
      end
    end
    return parts
  end
  local function val_series(parts)
    for i, dat in ipairs(dats) do
      if has[i].val then
        parts[#parts + 1] = ('%s index 1 using 1:2 with linespoints pt 7 ps 0.6 dt 2 lc %d title %s'):format(
          quote.gnuplot(dat), i, quote.gnuplot(names[i] .. ' (validation)'))
      end
    end
    return parts
  end
  local function draw(parts)
    if #parts > 0 then return 'plot ' .. table.concat(parts, ', ') end
    return "set xrange [0:1]\nset yrange [0:1]\nset label 1 'not logged' at graph 0.5, graph 0.5 center\n"
      .. 'plot NaN notitle\nunset label 1\nset autoscale'
  end
  return {
    "set datafile missing '?'",
    'set multiplot layout 2,2',
    "set grid", "set key top right", "set xlabel 'step'",
    "set title 'loss'", "set ylabel 'loss'",
    draw(val_series(series(2, {}))),
    "set title 'learning rate'", "set ylabel 'lr'", "set format y '%.1e'",
    draw(series(3, {})),
    "set format y '%g'",
    "set title 'throughput'", "set ylabel 'tokens/s'",
    draw(series(4, {})),
    "set title 'peak memory'", "set ylabel 'MiB'",
    draw(series(5, {})),
    'unset multiplot',
  }
end

-- Draw the runs of `paths` (metrics JSONL files) into <base>.png and
-- <base>.svg. opts: width, height (pixels; 1200x800), title. Returns {png
-- =, svg =, gp =, dats = {...}}; fails naming the file or gnuplot's error.
function M.draw(paths, base, opts)
  opts = opts or {}
  if #paths == 0 then fail('no metrics files given') end
  local width, height = opts.width or 1200, opts.height or 800
  -- a name no gnuplot string holds (a NUL) is refused before anything is written
  local ok, why = pcall(quote.gnuplot, base)
  if not ok then fail(('cannot plot into %s: %s'):format(quote.shown(base), why)) end
  local dats, names, has = {}, {}, {}
  for i, path in ipairs(paths) do
    local run = M.read(path)
    dats[i] = ('%s.%d.dat'):format(base, i)
    names[i] = name_of(path)
    local text
    text, has[i] = M.data_text(run)
    write(dats[i], text)
  end
  local out = { png = base .. '.png', svg = base .. '.svg', gp = base .. '.gp', dats = dats }
  -- gnuplot writes the images: a FIFO there would block it
  for _, image in ipairs({ out.png, out.svg }) do
    local writable, why = files.check_output(image)
    if not writable then fail(why) end
  end
  local body = table.concat(panels(dats, names, has), '\n')
  local title = opts.title or table.concat(names, ', ')
  local script = table.concat({
    '# ' .. quote.gnuplot(title) .. ' (fsdp.plot)',
    ("set terminal pngcairo size %d,%d font ',9' noenhanced"):format(width, height),
    'set output ' .. quote.gnuplot(out.png),
    body,
    ("set terminal svg size %d,%d font 'sans,9' noenhanced"):format(width, height),
    'set output ' .. quote.gnuplot(out.svg),
    body,
    'set output',
  }, '\n') .. '\n'
  write(out.gp, script)
  local text, rc = quote.capture({ 'gnuplot', out.gp })
  if rc == 127 then fail('gnuplot is not installed (Debian: apt-get install gnuplot-nox)') end
  if rc ~= 0 then fail(('gnuplot failed on %s (exit %d): %s'):format(out.gp, rc, text)) end
  -- gnuplot exits 0 without a word when it cannot write an image (on a
  -- full disk it left 4 KiB of the PNG and an empty SVG): an image that is
  -- not there whole, up to its last chunk or closing tag, is a failure.
  -- A torn image is removed, not left to pass for the plot.
  local png, svg = files.read(out.png) or '', files.read(out.svg) or ''
  if M.png_size(out.png) == nil or png:sub(-8, -5) ~= 'IEND' then
    os.remove(out.png)
    os.remove(out.svg)
    fail(('gnuplot did not write %s whole (%d bytes of it)'):format(out.png, #png))
  end
  if not svg:find('</svg>%s*$') then
    os.remove(out.svg)
    fail(('gnuplot did not write %s whole (%d bytes of it)'):format(out.svg, #svg))
  end
  return out
end

-- Width and height of a PNG file (its IHDR chunk), or nil and why.
function M.png_size(path)
  local f = io.open(path, 'rb')
  if not f then return nil, 'cannot open ' .. path end
  local head = f:read(24) or ''
  f:close()
  if #head < 24 or head:sub(1, 8) ~= '\137PNG\r\n\26\n' or head:sub(13, 16) ~= 'IHDR' then
    return nil, path .. ' is not a PNG file'
  end
  local function be32(s) local a, b, c, d = s:byte(1, 4); return ((a * 256 + b) * 256 + c) * 256 + d end
  return be32(head:sub(17, 20)), be32(head:sub(21, 24))
end

return M
