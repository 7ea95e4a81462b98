-- tensorboard_spec.lua: our TensorBoard event files (fsdp.tensorboard)
-- against what the tensorboard package read from them
-- (tests/golden/make_tfevents_goldens.py): the files remade by
-- tests/golden/tensorboard/make.lua are byte for byte the golden ones,
-- and our reader sees in them what tensorboard saw; CRC-32C's check value;
-- a damaged record is named; a resume's truncation.
local ffi = require 'ffi'
local core = require 'fsdp.core'
local files = require 'fsdp.io.files'
local host = require 'fsdp.host'
local json = require 'fsdp.io.json'
local T = require 'fsdp.testing'
local tb = require 'fsdp.observe.tensorboard'

local GOLDEN = host.root .. '/tests/golden/tensorboard'

local function close(got, want)
  if type(want) == 'string' then return tostring(got) == (want == "inf" and 'inf' or want) end
  return math.abs(got - want) <= 1e-6 * math.abs(want)
end

describe('fsdp.observe.tensorboard', function()
  it('CRC-32C gives the catalogue check value', function()
    assert.equals(0xE3069283, core.C.fl_crc32c(0, '123456789', 9))
  end)

  it('remakes the golden event files byte for byte', function()
    local dir = T.tmpdir()
    local out, rc = T.run_script('tests/golden/tensorboard/make.lua', T.quote(dir), 60)
    assert.equals(0, rc, out)
    for _, name in ipairs({ 'events.out.tfevents.1.golden', 'events.out.tfevents.2.golden' }) do
      local got, want = files.read(files.join(dir, name)), files.read(files.join(GOLDEN, name))
      assert.truthy(want, name)
      assert.equals(#want, #got, name)
      assert.truthy(got == want, name .. ' differs from the golden file')
    end
    files.remove_tree(dir)
  end)

  it('reads back what the tensorboard package read', function()
    local golden = json.decode(files.read(GOLDEN .. '/read.json'))
    for name, want in pairs(golden.files) do
      local got = tb.read(files.join(GOLDEN, name))
      assert.equals(#want, #got, name)
      for k, w in ipairs(want) do
        local g = got[k]
        assert.equals(w.step, g.step)
        assert.equals(w.wall_time, g.wall_time)
        assert.equals(w.file_version, g.file_version)
        local values = w.values or {}
        assert.equals(#values, #g.values)
        for j, v in ipairs(values) do
          assert.equals(v.tag, g.values[j].tag)
          if v.text then assert.equals(v.text, g.values[j].text)
          else assert.truthy(close(g.values[j].value, v.value), ('%s %s: %s vs %s'):format(name, v.tag,
            tostring(g.values[j].value), tostring(v.value))) end
        end
      end
    end
    -- the dashboard's series: the resumed run's steps follow the truncated run's, each once
    local steps = {}
    for _, s in ipairs(golden.scalars['train/loss']) do steps[#steps + 1] = s[1] end
    assert.same({ 1, 2, 3, 4, 5, 6, 7, 300000 }, steps)
  end)

  it('names the file and byte of a damaged record', function()
    local dir = T.tmpdir()
    local w = tb.Writer(dir)
    w:scalars(1, { { 'loss', 1 } })
    w:close()
    local text = files.read(w.path)
    local f = assert(io.open(w.path, 'wb'))
    f:write(text:sub(1, -6), string.char((text:byte(-5) + 1) % 256), text:sub(-4))
    f:close()
    T.raises(function() tb.read(w.path) end, w.path .. ': record at byte')
    files.remove_tree(dir)
  end)

  it('truncate_after drops the events past a resume step, in every earlier file', function()
    local dir = T.tmpdir()
    local w = tb.Writer(dir)
    for s = 1, 9 do w:scalars(s, { { 'loss', 10 - s } }) end
    w:close()
    assert.equals(5, tb.truncate_after(dir, 4))
    local got = {}
    for _, e in ipairs(tb.read(w.path)) do got[#got + 1] = e.step end
    assert.same({ 0, 1, 2, 3, 4 }, got)
    assert.equals(0, tb.truncate_after(dir, 4))
    files.remove_tree(dir)
  end)
end)
