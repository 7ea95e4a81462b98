-- requires_spec.lua: the layering rule of the Lua library and the models
-- (docs/ARCHITECTURE.md, "Lua layers"): tools/requires.lua reads every
-- require of lua/fsdp and models/ from the source, at the top of a file or
-- inside a function, and finds no circle between files, also counting the
-- modules a file loads by computed name (--named); every require left
-- inside a function says why in a `-- lazy:` comment; and the tool does
-- find a circle, or a reason missing, where there is one.
local function run(cmd)
  local f = assert(io.popen(cmd .. ' 2>&1'))
  local out = f:read('*a')
  local ok = f:close()
  return out, ok == true or ok == 0
end

local root = io.popen('pwd'):read('*l')

describe('the Lua require graph', function()
  for _, mode in ipairs({ '', ' --named' }) do
    it('has no circle between the files of lua/fsdp and models/' .. (mode ~= '' and ', counting names loaded by '
       .. 'computed name' or '') .. ', and a reason for each require inside a function', function()
      local out = run('luajit tools/requires.lua' .. mode .. '; echo "exit $?"')
      print(out:match('[^\n]*modules, [^\n]*'))
      assert.matches('exit 0', out, 1, true)
      assert.matches(' 0 circle%(s%)', out)
      assert.matches('%(0 without a reason%)', out)
      -- (the graph is the library's: a reading that found nothing would pass)
      local modules, edges = out:match('(%d+) modules, (%d+) edges')
      assert.is_true(tonumber(modules) > 100 and tonumber(edges) > 400, out)
    end)
  end

  it('finds a circle closed by a require inside a function, and names its files', function()
    local dir = os.tmpname()
    os.remove(dir)
    assert.is_true(os.execute('mkdir -p ' .. dir .. '/lua/fsdp/x') == 0)
    local function write(path, text)
      local f = assert(io.open(dir .. '/' .. path, 'w'))
      f:write(text)
      f:close()
    end
    write('lua/fsdp/x/a.lua', "local b = require 'fsdp.x.b'\nreturn {}\n")
    write('lua/fsdp/x/b.lua', "-- require 'fsdp.x.c' in a comment is no require\n"
      .. "local s = [[require('fsdp.x.c')]]\n"
      .. "local M = {}\nfunction M.f()\n  if true then\n    return require('fsdp.x.a')\n  end\nend\nreturn M\n")
    write('lua/fsdp/x/c.lua', "return require 'fsdp.x.b'\n")
    local out = run('cd ' .. dir .. ' && luajit ' .. root .. '/tools/requires.lua; echo "exit $?"')
    os.execute('rm -r ' .. dir)
    assert.matches('exit 1', out, 1, true)
    assert.matches('circle of 2 modules: fsdp.x.a fsdp.x.b', out, 1, true)
    assert.matches('lua/fsdp/x/b.lua:6, in a function', out, 1, true)
    assert.matches('3 modules, 3 edges, 1 circle(s) (2 modules in them), 1 require(s) inside functions '
      .. '(1 without a reason)', out, 1, true)
    assert.matches('no `-- lazy:` reason above it: lua/fsdp/x/b.lua:6 fsdp.x.a', out, 1, true)
  end)

  it('finds a circle closed by a module loaded by computed name only with --named, and takes a lazy: reason', function()
    local dir = os.tmpname()
    os.remove(dir)
    assert.is_true(os.execute('mkdir -p ' .. dir .. '/lua/fsdp/y') == 0)
    local function write(path, text)
      local f = assert(io.open(dir .. '/' .. path, 'w'))
      f:write(text)
      f:close()
    end
    -- a loads its parts by name; b, one of them, requires a back
    write('lua/fsdp/y/a.lua', "local PARTS = { 'fsdp.y.b' }\nlocal M = {}\n"
      .. "for _, p in ipairs(PARTS) do M[p] = require(p) end\n"
      .. "function M.get(n)\n  -- lazy: start-up (a test of the reason)\n  return require('fsdp.y.' .. n)\nend\n"
      .. "return M\n")
    write('lua/fsdp/y/b.lua', "local a = require 'fsdp.y.a'\nreturn {}\n")
    local plain = run('cd ' .. dir .. ' && luajit ' .. root .. '/tools/requires.lua; echo "exit $?"')
    local named = run('cd ' .. dir .. ' && luajit ' .. root .. '/tools/requires.lua --named; echo "exit $?"')
    os.execute('rm -r ' .. dir)
    assert.matches('exit 0', plain, 1, true)
    assert.matches('2 modules, 1 edges, 0 circle(s) (0 modules in them), 0 require(s) inside functions '
      .. '(0 without a reason), 2 dynamic', plain, 1, true)
    assert.matches('exit 1', named, 1, true)
    assert.matches('circle of 2 modules: fsdp.y.a fsdp.y.b', named, 1, true)
  end)
end)
