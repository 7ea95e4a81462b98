-- tests/golden/tensorboard/make.lua: the event files of the TensorBoard golden
-- test, written by fsdp.tensorboard with fixed wall times so the bytes are
-- reproducible. Usage: fsdp-lua tests/golden/tensorboard/make.lua OUT_DIR
--
-- OUT_DIR/events.out.tfevents.1.golden: a run killed after step 6 whose
-- resume at step 4 truncated it (its steps 5-6 dropped); ...2.golden: the
-- resumed run, steps 5-7 and a large step (multi-byte varints). Values
-- cover a negative, a tiny, a large and an infinite float and a
-- non-ASCII text summary. tests/golden/make_tfevents_goldens.py reads them
-- with the tensorboard package; tests/lua/tensorboard_spec.lua remakes
-- them and compares.
local tb = require 'fsdp.observe.tensorboard'
local files = require 'fsdp.io.files'
local out = assert(arg[1], 'usage: fsdp-lua tests/golden/tensorboard/make.lua OUT_DIR')
local t = 1700000000
local function clock() t = t + 0.25; return t end

local function run(steps, name, config)
  local w = tb.Writer(out, { wall_time = clock })
  w:text('config', config, steps[1] - 1)
  for _, s in ipairs(steps) do
    w:scalars(s, { { 'train/loss', 4 - s / 8 }, { 'train/lr', 3e-4 * s }, { 'train/grad_norm', -s * 1e-30 },
                   { 'memory/peak_mib', 2 ^ 20 + s } })
  end
  w:scalars(steps[#steps], { { 'val/loss', 1 / 3 }, { 'val/perplexity', math.huge } })
  w:close()
  assert(os.rename(w.path, files.join(out, 'events.out.tfevents.' .. name)))
end

run({ 1, 2, 3, 4, 5, 6 }, '1.golden', '| option | value |\n|---|---|\n| lr | 3e-4 |')
tb.truncate_after(out, 4)
run({ 5, 6, 7, 300000 }, '2.golden', 'résumé at step 4 — ünïcode')
