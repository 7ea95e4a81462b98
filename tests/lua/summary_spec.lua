-- summary_spec.lua: fsdp.summary: totals equal num_parameters (tied
-- weights once), per-module counts equal the parameters under each path,
-- runs of equal layers fold, depth collapses, bytes follow dtypes, the
-- printed table, and errors.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local llama = require 'models.llama'
local t5 = require 'models.t5'
local gpt2 = require 'models.gpt2'

-- Parameters whose fully qualified name is under `path` (first names, as
-- named_parameters gives them).
local function params_under(model, path)
  local n = 0
  for _, np in ipairs(model:named_parameters()) do
    if path == '' or np[1]:sub(1, #path + 1) == path .. '.' then n = n + np[2]:numel() end
  end
  return n
end

local capture_stdout = require('fsdp.testing').capture_stdout

describe('fsdp.repl.summary', function()
  it('totals equal num_parameters, tied weights counted once', function()
    local models = {
      llama.build('tiny', { device = 'meta' }),
      llama.build('Llama-3.2-1B', { device = 'meta' }),   -- tied embedding
      t5.build('t5-small', { device = 'meta' }),            -- tied, shared by two stacks
      gpt2.build('tiny', { device = 'meta' }),
      llama.build('Llama-2-70b', { device = 'meta' }),
    }
    for _, m in ipairs(models) do
      local s = fsdp.summary(m, { print = false })
      assert.are.equal(m:num_parameters(), s.total_params, m:class_name())
      assert.are.equal(m:num_parameters() * 4, s.total_bytes)
      assert.are.equal(m:num_parameters(), s.rows[1].params)
      assert.are.equal('', s.rows[1].name)
    end
    assert.are.equal(1235814400, fsdp.summary(models[2], { print = false }).total_params)
  end)

  it('gives every module the parameters of its subtree', function()
    local m = llama.build('tiny', { device = 'meta' })
    local s = fsdp.summary(m, { print = false, fold = false })
    assert.are.equal(#m:named_modules(), #s.rows)
    for _, row in ipairs(s.rows) do
      assert.are.equal(params_under(m, row.name), row.params, row.name)
      assert.are.equal(1, row.count)
    end
    local by_name = {}
    for _, row in ipairs(s.rows) do by_name[row.name] = row end
    local q = by_name['model.layers.1.self_attn.q_proj']
    assert.are.equal('Linear', q.class)
    assert.are.equal('weight [64, 64]', q.shape)
    assert.are.equal('f32', q.dtype)
    assert.are.equal(64 * 64 * 4, q.bytes)
    assert.are.equal(5, q.depth)
    assert.are.equal('', by_name['model.layers'].shape)  -- holds nothing itself
  end)

  it('folds runs of equal layers into one row counting them all', function()
    local m = llama.build('Llama-2-70b', { device = 'meta' })
    local s = fsdp.summary(m, { print = false })
    local fold
    for _, row in ipairs(s.rows) do if row.name == 'model.layers.0-79' then fold = row end end
    assert.is_table(fold)
    assert.are.equal(80, fold.count)
    assert.are.equal('80 x LlamaDecoderLayer', fold.class)
    assert.are.equal(params_under(m, 'model.layers'), fold.params)
    -- The first layer's insides follow, and no other layer appears.
    local names = {}
    for _, row in ipairs(s.rows) do names[row.name] = true end
    assert.is_true(names['model.layers.0.mlp.down_proj'])
    assert.is_nil(names['model.layers.1'])
    assert.is_nil(names['model.layers.5.mlp'])
    assert.is_true(#s.rows < 25)
  end)

  it('does not fold layers that differ', function()
    -- T5's first block has the relative attention bias, the others not.
    local s = fsdp.summary(t5.build('t5-small', { device = 'meta' }), { print = false, depth = 2 })
    local names = {}
    for _, row in ipairs(s.rows) do names[#names + 1] = row.name end
    assert.are.same({ '', 'shared', 'encoder', 'encoder.block', 'encoder.final_layer_norm',
                      'encoder.dropout', 'decoder', 'decoder.block', 'decoder.final_layer_norm',
                      'decoder.dropout', 'lm_head' }, names)
    s = fsdp.summary(t5.build('t5-small', { device = 'meta' }), { print = false, depth = 3 })
    names = {}
    for _, row in ipairs(s.rows) do names[row.name] = row end
    assert.are.equal(1, names['encoder.block.0'].count)
    assert.are.equal(5, names['encoder.block.1-5'].count)
  end)

  it('collapses deep trees with depth', function()
    local m = llama.build('tiny', { device = 'meta' })
    local s = fsdp.summary(m, { print = false, depth = 0 })
    assert.are.equal(1, #s.rows)
    assert.are.equal(m:num_parameters(), s.rows[1].params)
    s = fsdp.summary(m, { print = false, depth = 1 })
    assert.are.same({ '', 'model', 'lm_head' }, { s.rows[1].name, s.rows[2].name, s.rows[3].name })
    assert.are.equal(3, #s.rows)
    assert.are.equal(m:num_parameters(), s.total_params)
  end)

  it('counts bytes by dtype', function()
    local Mixed = nn.Module:extend('Mixed')
    function Mixed:__init()
      self.a = nn.Linear(8, 4, { device = 'meta', dtype = 'bf16' })
      self.b = nn.Linear(4, 2, { device = 'meta' })
    end
    local s = fsdp.summary(Mixed(), { print = false })
    assert.are.equal(36, s.by_dtype.bf16.params)
    assert.are.equal(72, s.by_dtype.bf16.bytes)
    assert.are.equal(10, s.by_dtype.f32.params)
    assert.are.equal(40, s.by_dtype.f32.bytes)
    assert.are.equal(112, s.total_bytes)
    assert.are.equal('bf16+f32', s.rows[1].dtype)
    assert.are.equal('weight [4, 8], bias [4]', s.rows[2].shape)
  end)

  it('prints the table and totals, and returns the data', function()
    local m = llama.build('Llama-2-70b', { device = 'meta' })
    local s
    local out = capture_stdout(function() s = fsdp.summary(m) end)
    assert.are.equal(s.text .. '\n', out)
    assert.matches('^module%s+class%s+params%s+shape%s+dtype%s+bytes\n', out)
    assert.matches('model.layers.0%-79%s+80 x LlamaDecoderLayer%s+68,452,352,000', out)
    assert.matches('model.embed_tokens%s+Embedding%s+262,144,000%s+weight %[32000, 8192%]%s+f32%s+1000.0 MiB', out)
    assert.matches('total: 68,976,648,192 parameters, 257.0 GiB %(275,906,592,768 bytes%) on meta', out)
    assert.matches('^summary: 68,976,648,192 parameters, 257.0 GiB in %d+ modules$', tostring(s))
  end)

  it('names what is wrong', function()
    local m = llama.build('tiny', { device = 'meta' })
    assert.error_matches(function() fsdp.summary(42) end, 'fsdp.summary: expected an nn.Module, got number')
    assert.error_matches(function() fsdp.summary(m, { depht = 2 }) end, 'unknown option depht')
    assert.error_matches(function() fsdp.summary(m, { depth = -1 }) end, 'depth must be a non%-negative integer')
    assert.error_matches(function() fsdp.summary(m, 3) end, 'expected an options table')
  end)
end)
