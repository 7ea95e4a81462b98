-- tools/plot.lua: loss, validation loss, learning rate, tokens/s and peak
-- memory against the step, of one run or several overlaid (one colour
-- and legend entry per file), from the recipes' --metrics_file JSONL.
--
--   fsdp-lua tools/plot.lua logs/run.jsonl                      -> logs/run.png, logs/run.svg
--   fsdp-lua tools/plot.lua a.jsonl b.jsonl --out=cmp/ab --size=1600x1000
--
-- gnuplot draws them (fsdp.plot); the script and the data it was given
-- stay beside the images (<out>.gp, <out>.N.dat) to re-plot by hand.
local options = require 'fsdp.options'
local plot = require 'fsdp.observe.plot'

local cfg, paths = options.config({
  out = { '', 'the images\' path without extension (default: the first file\'s, without .jsonl)', output = 'file' },
  size = { '1200x800', 'image width x height in pixels', check = function(v)
    if not v:match('^%d+x%d+$') then return 'must be WIDTHxHEIGHT, e.g. 1200x800' end
  end },
  title = { '', 'the title in the gnuplot script (default: the run names)' },
}, arg, 'tools/plot.lua', nil, { positional = 'METRICS.jsonl ...' })

if #paths == 0 then options.usage_error('tools/plot.lua: give one or more metrics JSONL files') end
for _, p in ipairs(paths) do
  local files = require 'fsdp.io.files'
  if files.mode(p) == nil then options.usage_error(('tools/plot.lua: %s: no such file'):format(p)) end
  local ok, why = files.check_input(p) -- a FIFO would block the read
  if not ok then options.usage_error('tools/plot.lua: ' .. why) end
end
local base = cfg.out ~= '' and cfg.out or paths[1]:gsub('%.jsonl$', '')
local w, h = cfg.size:match('^(%d+)x(%d+)$')
local ok, out = pcall(plot.draw, paths, base, { width = tonumber(w), height = tonumber(h),
                                                title = cfg.title ~= '' and cfg.title or nil })
if not ok then
  io.stderr:write('fsdp-lua: tools/plot.lua: ', options.bare(out), '\n')
  os.exit(1)
end
print(('plot: wrote %s and %s (%d run%s)'):format(out.png, out.svg, #paths, #paths == 1 and '' or 's'))
