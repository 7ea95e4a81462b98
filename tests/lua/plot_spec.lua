-- plot_spec.lua: fsdp.plot and tools/plot.lua: two known runs' metrics
-- files drawn into a PNG of the asked size (read from its header) and an
-- SVG; the data gnuplot was given holds each run's curve (a step written
-- twice counts with its last record, validation in its own block); a file
-- that is not a metrics file is named.
local files = require 'fsdp.io.files'
local plot = require 'fsdp.observe.plot'
local T = require 'fsdp.testing'

local gnuplot = select(2, T.sh('command -v gnuplot')) == 0

-- A run of `n` steps: loss = a - step / 10, lr = step * 1e-4, tokens/s =
-- 100 * step, peak 1 MiB * step; validations every 5 steps; step 3
-- written twice (a resume before the drop of superseded lines), the first
-- time with a wrong loss.
local function write_run(path, a, n)
  local f = assert(io.open(path, 'w'))
  for s = 1, n do
    if s == 3 then f:write('{"type":"train","step":3,"loss":99,"lr":0}\n') end
    f:write(('{"type":"train","step":%d,"loss":%.17g,"lr":%.17g,"tokens_per_sec":%d,"peak_memory_bytes":%d}\n')
      :format(s, a - s / 10, s * 1e-4, 100 * s, s * 2 ^ 20))
    if s % 5 == 0 then f:write(('{"type":"val","step":%d,"loss":%.17g,"perplexity":1}\n'):format(s, a - s / 8)) end
  end
  f:close()
end

describe('fsdp.observe.plot', function()
  it('draws two runs into a PNG of the asked size and an SVG, from the runs\' curves', function()
    if not gnuplot then return pending('gnuplot not installed (Debian: gnuplot-nox; ./build.sh installs it)') end
    local dir = T.tmpdir()
    write_run(dir .. '/a.jsonl', 5, 12)
    write_run(dir .. '/b.jsonl', 4, 10)
    local out, rc = T.run_script('tools/plot.lua', ('%s %s --out=%s --size=640x480'):format(
      T.quote(dir .. '/a.jsonl'), T.quote(dir .. '/b.jsonl'), T.quote(dir .. '/ab')), 60)
    assert.equals(0, rc, out)
    assert.matches('plot: wrote ' .. dir .. '/ab.png and ' .. dir .. '/ab.svg (2 runs)', out, 1, true)
    assert.same({ 640, 480 }, { plot.png_size(dir .. '/ab.png') })
    assert.truthy(files.read(dir .. '/ab.svg'):find('<svg', 1, true))
    -- what gnuplot was given: run a's curve
    local train, val = {}, {}
    local block = train
    for line in io.lines(dir .. '/ab.1.dat') do
      if line == '' then block = val
      elseif not line:match('^#') then
        local row = {}
        for word in line:gmatch('%S+') do row[#row + 1] = tonumber(word) or word end
        block[#block + 1] = row
      end
    end
    assert.equals(12, #train)
    for s = 1, 12 do
      local r = train[s]
      assert.equals(s, r[1])
      assert.near(5 - s / 10, r[2], 1e-8)
      assert.near(s * 1e-4, r[3], 1e-12)
      assert.equals(100 * s, r[4])
      assert.equals(s, r[5])
    end
    assert.same({ { 5, 5 - 5 / 8 }, { 10, 5 - 10 / 8 } }, val)
    -- the script names both runs' data for the legend
    local gp = files.read(dir .. '/ab.gp')
    assert.truthy(gp:find('title "a"', 1, true) and gp:find('title "b"', 1, true), gp)
    files.remove_tree(dir)
  end)

  it('draws a run that logged no tokens/s and no validation, saying so in those panels', function()
    if not gnuplot then return pending('gnuplot not installed (Debian: gnuplot-nox; ./build.sh installs it)') end
    local dir = T.tmpdir()
    local f = assert(io.open(dir .. '/t5.jsonl', 'w'))
    for s = 1, 3 do f:write(('{"type":"train","step":%d,"loss":%d,"lr":0.1,"peak_memory_bytes":1048576}\n'):format(s, 4 - s)) end
    f:close()
    local out = plot.draw({ dir .. '/t5.jsonl' }, dir .. '/t5', { width = 320, height = 240 })
    assert.same({ 320, 240 }, { plot.png_size(out.png) })
    local gp = files.read(out.gp)
    assert.truthy(gp:find("'not logged'", 1, true), gp)
    assert.falsy(gp:find('(validation)', 1, true), gp)
    files.remove_tree(dir)
  end)

  it('names a file that is not a metrics file, and a missing one', function()
    local dir = T.tmpdir()
    local f = assert(io.open(dir .. '/bad.jsonl', 'w'))
    f:write('{"type":"train","step":1,"loss":1}\nnot json\n')
    f:close()
    T.raises(function() plot.draw({ dir .. '/bad.jsonl' }, dir .. '/x') end, dir .. '/bad.jsonl:2: not a JSON object')
    local out, rc = T.run_script('tools/plot.lua', T.quote(dir .. '/none.jsonl'), 60)
    assert.equals(2, rc, out)
    assert.matches('fsdp-lua: tools/plot.lua: ' .. dir .. '/none.jsonl: no such file', out, 1, true)
    files.remove_tree(dir)
  end)
end)
