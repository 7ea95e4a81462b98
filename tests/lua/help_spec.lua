-- help_spec.lua: help(fn) for every public function of `fsdp` shows its
-- signature, a description that ends with a full sentence, and every
-- option the function reads from its options table (fsdp.help,
-- [Note: help texts are doc comments]); models' and recipes' descriptions
-- in help() are whole sentences.
local fsdp = require 'fsdp'
local help = require 'fsdp.repl.help'
local complete = require 'fsdp.repl.complete'
local capture_stdout = require('fsdp.testing').capture_stdout

-- The submodules whose functions (and nn's classes) are public API as well
-- (fsdp.sharding's public parts are fsdp.shard & co).
local SUBMODULES = { 'dist', 'optim', 'checkpointing', 'autograd', 'cuda', 'devices', 'policy', 'safetensors',
                     'F', 'nn' }

-- Every public callable of a table (functions and callable tables), the
-- lazily loaded ones (fsdp.plan) loaded, as {name =, value =}.
local function callables(prefix, t, list)
  local names = {}
  for k in pairs(complete.names(t)) do
    if type(k) == 'string' and k:sub(1, 1) ~= '_' then names[#names + 1] = k end
  end
  table.sort(names)
  for _, k in ipairs(names) do
    local v = t[k]
    local mt = getmetatable(v)
    if type(v) == 'function' or (type(v) == 'table' and type(mt) == 'table' and rawget(mt, '__call')) then
      list[#list + 1] = { name = prefix .. k, value = v }
    end
  end
  return list
end

local function public_functions()
  local list = callables('fsdp.', fsdp, {})
  for _, sub in ipairs(SUBMODULES) do callables('fsdp.' .. sub .. '.', fsdp[sub], list) end
  return list
end

local function ends_with_sentence(text)
  return text:gsub('%s+$', ''):match('[%.!?][%)"\'`]*$') ~= nil
end

describe('help(fn)', function()
  local functions = public_functions()

  it('finds the public functions (the lazily loaded ones too)', function()
    local seen = {}
    for _, f in ipairs(functions) do seen[f.name] = true end
    for _, name in ipairs { 'fsdp.randn', 'fsdp.shard', 'fsdp.plan', 'fsdp.save_full_state_dict',
                            'fsdp.load_safetensors_into', 'fsdp.checkpoint', 'fsdp.dist.all_reduce',
                            'fsdp.optim.AdamW', 'fsdp.checkpointing.save' } do
      assert(seen[name], name .. ' is not among the public functions')
    end
    assert(#functions >= 100, ('only %d public functions found'):format(#functions))
  end)

  it('of every public function: signature, a description ending with a full sentence, its options', function()
    local problems = {}
    for _, f in ipairs(functions) do
      local info = help.info(f.value)
      if not info then
        problems[#problems + 1] = f.name .. ': help.info found nothing'
      else
        local text = table.concat(info.doc, '\n')
        local described = info.signature .. '\n' .. text   -- options may be named in the signature
        -- the name help gives (one of the value's names: fsdp.no_grad for fsdp.autograd.no_grad)
        local shown = info.signature:match('^([%w_.]+)%(')
        local resolved = shown and shown:match('^fsdp%.') and fsdp
        for part in (shown or ''):gmatch('[%w_]+') do
          if part ~= 'fsdp' and type(resolved) == 'table' then resolved = resolved[part] end
        end
        if not rawequal(resolved, f.value) then
          problems[#problems + 1] = ('%s: signature %q'):format(f.name, info.signature)
        end
        if text:match('^%s*$') then
          problems[#problems + 1] = ('%s: no description (a comment above %s)'):format(f.name, info.where)
        elseif not ends_with_sentence(text) then
          problems[#problems + 1] = ('%s: the description does not end with a full sentence: ...%q (%s)')
            :format(f.name, text:gsub('%s+$', ''):sub(-50), info.where)
        end
        for _, option in ipairs(info.options) do
          if not described:match('%f[%w_]' .. option .. '%f[^%w_]') then
            problems[#problems + 1] = ('%s: reads opts.%s, which its help does not name (%s)')
              :format(f.name, option, info.where)
          end
        end
        -- and help() prints it
        local out = capture_stdout(function() help.help(f.value) end)
        if not out:find(info.signature, 1, true) then
          problems[#problems + 1] = f.name .. ': help() does not print the signature'
        end
      end
    end
    assert.are.same({}, problems)
  end)

  it('shows fsdp.plan with its options and their defaults', function()
    local out = capture_stdout(function() help.help(fsdp.plan) end)
    assert.matches('^fsdp%.plan%(model, opts%)\n', out)
    for _, option in ipairs { 'world', 'nodes', 'strategy', 'policy', 'mixed_precision', 'checkpoint',
                              'offload_activations', 'optimizer', 'batch', 'seq', 'device', 'grad_accum' } do
      assert.matches('%f[%w_]' .. option .. '%f[^%w_]', out)
    end
    assert.matches("world %(default: this job's size%)", out)
    assert.matches('methods:\n.*max_batch', out)  -- what the callable table has besides
  end)

  it('reads the options a function takes from its body', function()
    local info = help.info(fsdp.shard)
    local options = {}
    for _, o in ipairs(info.options) do options[o] = true end
    for _, o in ipairs { 'policy', 'strategy', 'mixed_precision', 'cpu_offload', 'seed', 'device' } do
      assert(options[o], 'fsdp.shard reads opts.' .. o)
    end
    assert.are.equal('fsdp.shard(model, opts)', info.signature)
    assert.matches('^turn `model`', info.doc[1])   -- the doc of fsdp.sharding.shard, not the forwarder's
  end)

  it('a factory-made function takes the comment of the line that names it', function()
    local info = help.info(fsdp.randn)
    assert.are.equal('fsdp.randn(shape, opts)', info.signature)
    assert.matches('N%(mean, std%^2%)', table.concat(info.doc, ' '))
  end)

  it('an nn class shows its constructor and the comment of its class', function()
    local info = help.info(fsdp.nn.Linear)
    assert.are.equal('fsdp.nn.Linear(in_features, out_features, opts)', info.signature)
    assert.matches('y = x W%^T %+ b', table.concat(info.doc, ' '))
    assert.are.equal('fsdp.nn.ReLU()', help.info(fsdp.nn.ReLU).signature)
    assert.matches('max%(x, 0%)', help.info(fsdp.nn.ReLU).doc[1])
  end)

  it('a module shows its header comment before its fields', function()
    local out = capture_stdout(function() help.help(fsdp.dist) end)
    assert.matches('^fsdp%.dist:\n  fsdp%.dist: process groups and collectives', out)
    assert.matches('methods:\n.*all_reduce', out)
  end)
end)

describe('help()', function()
  it('describes every model and recipe by whole sentences', function()
    local host = require 'fsdp.host'
    local out = capture_stdout(function() help.help() end):gsub('%s+', ' ')
    local checked = 0
    for _, dir in ipairs { 'models', 'recipes' } do
      local p = io.popen('ls ' .. host.root .. '/' .. dir)
      for name in p:lines() do
        if name:match('%.lua$') and name ~= 'common.lua' then
          local summary = help.file_summary(host.root .. '/' .. dir .. '/' .. name)
          assert(ends_with_sentence(summary), ('%s/%s: cut mid-sentence: %s'):format(dir, name, summary))
          assert(out:find(summary:gsub('%s+', ' '), 1, true), ('help() does not show %q'):format(summary))
          checked = checked + 1
        end
      end
      p:close()
    end
    assert(checked >= 10, 'models and recipes found: ' .. checked)
    assert.are.equal('the Llama 2 / Llama 3 family, with Hugging Face parameter names '
      .. '(model.layers.N.self_attn.q_proj.weight, ...), so that Hugging Face checkpoints load '
      .. 'unchanged and our exports load in HF.',
      help.file_summary(host.root .. '/models/llama.lua'))
  end)

  it('takes the first sentence of a paragraph, not a period inside parentheses or "et al."', function()
    assert.are.equal('A (b. C) d.', help.first_sentence('A (b. C) d. Next one.'))
    assert.are.equal('GPT-2 (Radford et al. 2019) with HF.', help.first_sentence('GPT-2 (Radford et al. 2019) with HF.'))
    assert.are.equal('Zhou et al. 2021 wrote it.', help.first_sentence('Zhou et al. 2021 wrote it. Then more.'))
    assert.are.equal('no period at all', help.first_sentence('no period at all'))
  end)
end)
