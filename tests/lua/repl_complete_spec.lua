-- repl_complete_spec.lua: the REPL's helpers in-process: Tab completion
-- candidates (fsdp.complete), the table printer (fsdp.pretty), help()
-- (fsdp.help) and options.expose. The terminal itself is driven through
-- tmux in host_spec.lua.
local complete = require 'fsdp.repl.complete'
local pretty = require 'fsdp.repl.pretty'
local help = require 'fsdp.repl.help'
local fsdp = require 'fsdp'
local llama = require 'models.llama'

-- Candidates for the line typed so far, with the word as libedit cuts it.
local function cands(before, env)
  local word = before:match('[^%s"\'`@$><=;|&{}()%[%],+%-*/%%^#~]*$')
  return complete.candidates(before, word, env)
end

local function has(list, item)
  for _, v in ipairs(list) do if v == item then return true end end
  return false
end

local capture_stdout = require('fsdp.testing').capture_stdout

describe('fsdp.repl.complete', function()
  local env = setmetatable({
    fsdp = fsdp,
    model = llama.build('tiny', { device = 'meta' }),
    x = fsdp.zeros(2, 3),
    cfg = { lr = 1, layers = { { width = 4 } }, ['not an id'] = 1, _private = 2 },
    print = print, pairs = pairs,
  }, {})

  it('completes fields of tables, the lazy submodules included', function()
    assert.are.same({ 'fsdp.rand', 'fsdp.randint', 'fsdp.randn' }, cands('fsdp.ra', env))
    assert.are.same({ 'fsdp.rand', 'fsdp.randint', 'fsdp.randn' }, cands('y = fsdp.ra', env))
    assert.is_true(has(cands('fsdp.', env), 'fsdp.optim'))   -- loaded on first use
    assert.is_true(has(cands('fsdp.', env), 'fsdp.summary'))
    assert.are.same({ 'fsdp.nn.Linear' }, cands('fsdp.nn.Lin', env))
  end)

  it('completes globals and keywords', function()
    assert.are.same({ 'false', 'for', 'fsdp', 'function' }, cands('f', env))
    assert.are.same({ 'print' }, cands('(pri', env))
  end)

  it('follows module children, numbered layers and indices', function()
    local layer = cands('model.model.layers["0"].', env)
    assert.is_true(has(layer, '.self_attn'))
    assert.is_true(has(layer, '.mlp'))
    assert.is_true(has(layer, '.forward'))   -- methods through the class
    local list = cands('model.model.layers.', env)
    assert.are.same({ 'model.model.layers["0"]', 'model.model.layers["1"]' }, { list[#list - 1], list[#list] })
    assert.is_true(has(list, 'model.model.layers.append'))
    assert.are.same({ '.mlp' }, cands('model.model.layers[1].ml', env))
    assert.are.same({ '.self_attn' }, cands('model.model.layers["0"].se', env))
    assert.are.same({ 'cfg.layers' }, cands('cfg.la', env))
    assert.are.same({ '.width' }, cands('cfg.layers[1].w', env))
  end)

  -- [Note: module names and Lua paths]
  it('offers only text that parses, and it evaluates to the module of that name', function()
    local by_name = {}
    for _, nm in ipairs(env.model:named_modules()) do by_name[nm[1]] = nm[2] end
    local function evaluates(text)
      local chunk, err = loadstring('return ' .. text)
      assert.is_not_nil(chunk, ('%s does not parse: %s'):format(text, tostring(err)))
      setfenv(chunk, env)
      return chunk()
    end
    -- every candidate for these prefixes parses; the numbered ones are the modules named so
    for _, typed in ipairs({ 'model.model.layers.', 'model.model.layers.0.', 'model.model.layers.1.ml',
                             'model.model.layers.1', 'model.model.layers["0"].self_attn.' }) do
      local got = cands(typed, env)
      assert.is_true(#got > 0, typed)
      local word = typed:match('[^%s"\'`@$><=;|&{}()%[%],+%-*/%%^#~]*$')
      for _, c in ipairs(got) do
        local line = typed:sub(1, #typed - #word) .. c
        assert.is_nil(line:find('%.%d'), line)            -- never `.0`, a syntax error
        evaluates(line)
      end
    end
    assert.are.same({ 'model.model.layers["0"].self_attn' }, cands('model.model.layers.0.se', env))
    assert.are.same({ 'model.model.layers["1"].mlp.up_proj' }, cands('model.model.layers.1.mlp.up', env))
    assert.are.equal(by_name['model.layers.0.self_attn'], evaluates('model.model.layers["0"].self_attn'))
    assert.are.equal(by_name['model.layers.1'], evaluates(cands('model.model.layers.1', env)[1]))
    -- integer indices stay Lua positions of the same list
    assert.are.equal(by_name['model.layers.0'], evaluates('model.model.layers[1]'))
    -- inside brackets: the names, closed
    assert.are.same({ '"0"]', '"1"]' }, cands('model.model.layers[', env))
    assert.are.same({ '1"]' }, cands('model.model.layers["1', env))
    assert.are.same({ "0']" }, cands("model.model.layers['0", env))
    assert.are.equal(by_name['model.layers.1'], evaluates('model.model.layers["1"]'))
    -- every module's name spelled as Lua reaches it
    for name, m in pairs(by_name) do
      if name ~= '' then assert.are.equal(m, evaluates('model.' .. complete.lua_path(name)), name) end
    end
    assert.are.equal('model.layers["0"].self_attn', complete.lua_path('model.layers.0.self_attn'))
  end)

  it('notes under a printed module how its numbered children are indexed', function()
    assert.are.equal('-- index by name: model.layers["0"] is the module named model.layers.0 '
      .. '(layers[1] is the same: Lua counts from 1)', complete.module_note(env.model))
    assert.is_nil(complete.module_note(env.model.model.layers['0'].mlp))   -- nothing numbered inside
    assert.is_nil(complete.module_note({ 1, 2 }))
  end)

  it('offers methods after ":" and tensor properties after "."', function()
    local m = cands('x:', env)
    assert.is_true(has(m, 'x:matmul'))
    assert.is_true(has(m, 'x:view'))
    assert.is_false(has(m, 'x:shape'))   -- a property, not a method
    assert.are.same({ 'x.shape' }, cands('x.sha', env))
    assert.are.same({ 'model:num_parameters' }, cands('model:num_p', env))
    assert.are.same({}, cands('model:model', env))  -- a child is not a method
  end)

  it('hides private names unless asked, and names that are not identifiers', function()
    assert.is_false(has(cands('cfg.', env), 'cfg._private'))
    assert.are.same({ 'cfg._private' }, cands('cfg._p', env))
    for _, c in ipairs(cands('cfg.', env)) do assert.is_nil(c:find(' ', 1, true)) end
    assert.is_false(has(cands('model.', env), 'model._modules'))
  end)

  it('offers nothing inside strings, comments, unknown paths and calls', function()
    assert.are.same({}, cands('print("fsdp.ra', env))
    assert.are.same({}, cands('x = 1 -- fsdp.ra', env))
    assert.are.same({}, cands('nothing.here.', env))
    assert.are.same({}, cands('fsdp.zeros(2).', env))
    assert.are.same({}, cands('3.', env))
    assert.are.same({}, cands('cfg[lr].', env))     -- not a literal index: never evaluated
  end)

  it('indents on a blank line', function()
    assert.are.same({ '  ' }, complete.candidates('', '', env))
    assert.are.same({ '  ' }, complete.candidates('    ', '', env))
  end)

  it('never calls what it completes', function()
    local calls = 0
    local trap = setmetatable({}, { __call = function() calls = calls + 1 end })
    local e = { f = function() calls = calls + 1 return {} end, t = trap }
    cands('f().', e)
    cands('t:', e)
    assert.are.equal(0, calls)
  end)
end)

describe('fsdp.repl.pretty', function()
  it('prints plain tables in key order, nested and cut', function()
    assert.are.equal('{1, 2, 3, lr = 0.0003, name = "a\\nb", nested = {x = true}}',
      pretty.format({ 1, 2, 3, lr = 3e-4, name = 'a\nb', nested = { x = true } }))
    assert.are.equal('{}', pretty.format({}))
    assert.are.equal('{["end"] = 2, ["not id"] = 1}', pretty.format({ ['not id'] = 1, ['end'] = 2 }))
    local cyc = {}
    cyc.me = cyc
    assert.are.equal('{me = <cycle>}', pretty.format(cyc))
    local big = {}
    for i = 1, 100 do big[i] = i end
    local text = pretty.format(big)
    assert.matches('%.%.%. %(60 more%)', text)
    for line in text:gmatch('[^\n]+') do assert.is_true(#line <= 82, line) end
  end)

  it('leaves values that print themselves to tostring, one line inside tables', function()
    local t = fsdp.zeros(2, 2)
    assert.is_nil(pretty.format(t))
    assert.is_nil(pretty.format(42))
    local m = llama.build('tiny', { device = 'meta' })
    assert.are.equal('{model = LlamaForCausalLM( ...}', pretty.format({ model = m }))
  end)
end)

describe('help()', function()
  it('lists the keys, the library, models and recipes', function()
    local out = capture_stdout(function() help.help() end)
    assert.matches('Tab completes names', out, 1, true)
    assert.matches('fsdp (global `fsdp`', out, 1, true)
    for _, name in ipairs { 'randn', 'summary', 'fake', 'memory_stats' } do
      assert.matches('%f[%w_]' .. name .. '%f[^%w_]', out)
    end
    assert.matches('fsdp.nn', out, 1, true)
    assert.matches('models.llama%s+the Llama 2 / Llama 3 family', out)
    assert.matches('models.t5', out, 1, true)
    assert.matches('llama2_7b%s+train Llama 2 7B', out)
    assert.matches('sweep%s+measure a training recipe', out)
    assert.is_nil(out:find('models.common', 1, true))  -- shared code, not a model
  end)

  it('describes a value: fields and methods', function()
    local out = capture_stdout(function() help.help(fsdp.zeros(2)) end)
    assert.matches('^Tensor\n', out)
    assert.matches('fields:\n.*shape.*methods:', out)
    assert.matches('methods:\n.*matmul', out)
  end)
end)

describe('recipe.expose', function()
  it('does nothing outside an interactive session', function()
    local options = require 'fsdp.options'
    local obj = {}
    assert.are.equal(obj, options.expose({ exposed_probe = obj }).exposed_probe)
    assert.is_nil(rawget(_G, 'exposed_probe'))
  end)
end)
