-- init_from_spec.lua: models/pretrained.lua on one process (the 2-rank
-- life of a model is tests/mpi/lifecycle.sh): what each --init_from path
-- is taken for, the mistakes refused before anything is built (one line
-- naming the path, exit status 2), the weights loaded into shards, and
-- --export_hf / save_pretrained of a sharded model (Llama, GPT-2 with its
-- Conv1D transposes, T5; split into files) loading back equal; GPT-2 and
-- T5 trained through their recipes from an HF directory.
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'
local hf = require 'models.hf'
local decoders = require 'models.decoders'
local pretrained = require 'models.pretrained'
local t5 = require 'models.t5'

local GOLDEN = 'tests/golden/hf/'

local function tmp() return T.tmpdir() end

-- A copy of a golden directory's config.json and weights.
local function hf_copy(name)
  local d = tmp()
  assert(os.execute(('cp %s/config.json %s/model.safetensors %s/'):format(GOLDEN .. name, GOLDEN .. name, d)) == 0)
  return d
end

-- The model of path, sharded on this one rank (units per block) and loaded.
local function sharded(path, opts)
  local src = pretrained.open(path, opts)
  local model, block
  if src.family == 't5' then
    model, block = t5.Model(src.config, { device = 'meta' }), t5.Block
  else
    local fam = decoders.families[src.family]
    model, block = fam.module.build(src.config, { device = 'meta' }), fam.block
  end
  fsdp.shard(model, { policy = fsdp.policy.transformer { block }, seed = 3 })
  pretrained.load(model, src)
  return model, src
end

local function params_equal(a, b, what)
  local bp = {}
  for _, p in ipairs(b:named_parameters()) do bp[p[1]] = p[2] end
  local n = 0
  for _, p in ipairs(a:named_parameters()) do
    assert(bp[p[1]], ('%s: %s missing'):format(what, p[1]))
    local d = T.max_abs_diff(p[2], bp[p[1]])
    assert(d == 0, ('%s: %s differs by %g'):format(what, p[1], d))
    n = n + 1
  end
  assert(n > 0)
end

describe('pretrained.open', function()
  it('takes an HF directory for its config, a family the caller does not train is refused', function()
    local src = pretrained.open(GOLDEN .. 'llama3_tiny_v5', { families = { 'llama', 'gpt2' } })
    assert.equals('hf', src.kind)
    assert.equals('llama', src.family)
    assert.equals(2, src.config.n_layers)
    assert.same({ bos_token_id = 1, eos_token_id = 2 }, src.token_ids)
    T.raises(function() pretrained.open(GOLDEN .. 't5_v1_1_tiny_v5', { families = { 'llama', 'gpt2' }, who = 'X' }) end,
      't5_v1_1_tiny_v5/config.json holds a t5 model; X takes llama or gpt2')
  end)

  it('names the path and what is wrong', function()
    local d = tmp()
    T.raises(function() pretrained.open(d .. '/nothing') end, d .. '/nothing does not exist')
    T.raises(function() pretrained.open(d) end,
      d .. ' is neither a Hugging Face model directory (it has no config.json) nor a checkpoint directory')
    os.execute(('cp %s/model.safetensors %s/'):format(GOLDEN .. 'llama3_tiny_v5', d))
    T.raises(function() pretrained.open(d) end, 'it has no config.json, only safetensors files')
    local cfg = assert(io.open(d .. '/config.json', 'w'))
    cfg:write('{"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, '
      .. '"vocab_size": 64, "intermediate_size": 48, "rope_wobble": 3}')
    cfg:close()
    T.raises(function() pretrained.open(d) end, "unknown key 'rope_wobble'")
  end)

  it('a full state dict tells shapes; the heads come from --model or --num_heads', function()
    local d = tmp()
    local m = hf.from_pretrained(GOLDEN .. 'llama3_tiny_v5')
    fsdp.checkpointing.save_full_state_dict(d .. '/model.safetensors', m)
    T.raises(function() pretrained.open(d .. '/model.safetensors') end, 'give --model (a llama config name) or --num_heads')
    local src = pretrained.open(d .. '/model.safetensors', { num_heads = 4 })
    assert.equals('state_dict', src.kind)
    assert.equals(2, src.config.n_kv_heads)
    assert.equals(48, src.config.ffn_dim)
  end)

  it('a shape the config does not give is refused at load naming the tensor and both shapes', function()
    local d = hf_copy('llama3_tiny_v5')
    local text = assert(io.open(d .. '/config.json')):read('*a')
    local f = assert(io.open(d .. '/config.json', 'w'))
    f:write((text:gsub('"intermediate_size": 48', '"intermediate_size": 40')))
    f:close()
    T.raises(function() sharded(d) end, 'model.layers.0.mlp.down_proj.weight')
    T.raises(function() sharded(d) end, '[32, 48]')
    T.raises(function() sharded(d) end, '[32, 40]')
  end)
end)

describe('loaded into shards and exported', function()
  it('Llama: the sharded model has the HF model\'s logits; its export (split in files) loads back equal', function()
    local model = sharded(GOLDEN .. 'llama3_tiny_v5')
    local g = fsdp.load_safetensors(GOLDEN .. 'llama3_tiny_v5/golden.safetensors')
    local d = fsdp.no_grad(function() return T.max_abs_diff(model(g.input_ids), g.logits_f32) end)
    assert(d <= 1e-4, ('logits differ by %g'):format(d))
    local out = tmp() .. '/export'
    local files = hf.save_pretrained(model, out, { max_shard_size = '20KB', token_ids = { eos_token_id = 2 } })
    assert(#files > 1, 'one file')
    local back = hf.from_pretrained(out)
    params_equal(back, hf.from_pretrained(GOLDEN .. 'llama3_tiny_v5'), 'llama export')
    local gen = require('fsdp.io.json').decode(require('fsdp.io.files').read(out .. '/generation_config.json'))
    assert.equals(2, gen.eos_token_id)
  end)

  it('a directory of several files (index.json) loads into shards as the single file does', function()
    local g = fsdp.load_safetensors(GOLDEN .. 'llama3_tiny/golden.safetensors')
    local model = sharded(GOLDEN .. 'llama3_tiny_sharded')
    local d = fsdp.no_grad(function() return T.max_abs_diff(model(g.input_ids), g.logits_f32) end)
    assert(d <= 1e-4, ('logits differ by %g'):format(d))
  end)

  it('GPT-2: HF\'s Conv1D layout goes out of a sharded model as it came in', function()
    local model = sharded(GOLDEN .. 'gpt2_tiny')
    local out = tmp() .. '/export'
    hf.save_pretrained(model, out)
    params_equal(hf.from_pretrained(out), hf.from_pretrained(GOLDEN .. 'gpt2_tiny'), 'gpt2 export')
    local f = fsdp.safetensors.open(out .. '/model.safetensors')
    local want = fsdp.safetensors.open(GOLDEN .. 'gpt2_tiny/model.safetensors')
    assert.same(want:info('transformer.h.0.attn.c_attn.weight').shape, f:info('transformer.h.0.attn.c_attn.weight').shape)
    f:close()
    want:close()
  end)

  it('T5: an untied transformers 5 checkpoint loads into shards and exports equal', function()
    local model = sharded(GOLDEN .. 't5_v1_1_untied_v5')
    local out = tmp() .. '/export'
    hf.save_pretrained(model, out)
    params_equal(hf.from_pretrained(out), hf.from_pretrained(GOLDEN .. 't5_v1_1_untied_v5'), 't5 export')
  end)
end)

describe('the recipes', function()
  it('refuse a size that contradicts --init_from, a family they do not train, an unwritable --export_hf', function()
    local llama_dir = GOLDEN .. 'llama3_tiny_v5'
    for _, case in ipairs({
      { 'recipes/llama2_7b.lua', '--init_from=' .. llama_dir .. ' --hidden_width=64',
        '--hidden_width=64 contradicts --init_from ' .. llama_dir .. '/config.json, whose model has dim 32' },
      { 'recipes/llama2_7b.lua', '--init_from=' .. llama_dir .. ' --model=gpt2',
        '--model=gpt2 is a gpt2 model, but --init_from ' .. llama_dir .. '/config.json holds a llama model' },
      { 'recipes/t5_3b.lua', '--init_from=' .. llama_dir, 'holds a llama model; recipes/t5_3b.lua takes t5' },
      { 'recipes/llama2_7b.lua', '--init_from=' .. llama_dir .. ' --export_hf=/proc/nope',
        '--export_hf: cannot create directory /proc/nope' },
      { 'recipes/llama2_7b.lua', '--init_from=' .. GOLDEN .. 'gpt2_tiny --seq_len=17',
        "--seq_len (17) is longer than the model's 16 positions" },
    }) do
      local out, rc = T.run_script(case[1], case[2] .. ' --max_steps=2 --warmup_steps=1')
      assert(rc == 2, ('%s %s: exit %d\n%s'):format(case[1], case[2], rc, out))
      assert(out:find(case[3], 1, true), ('%s %s: %s'):format(case[1], case[2], out))
      assert(not out:find('config:', 1, true), 'refused after the config was printed')
    end
  end)

  it('export with the starting directory\'s tokenizer files and token ids, also from its checkpoint', function()
    local src = hf_copy('llama3_tiny_v5')
    local files = require 'fsdp.io.files'
    files.write_atomic(src .. '/tokenizer.json', '{"model": {"type": "BPE"}}\n')
    files.write_atomic(src .. '/tokenizer_config.json', '{"eos_token": "</s>"}\n')
    files.write_atomic(src .. '/generation_config.json', '{"bos_token_id": 1, "eos_token_id": [2, 7]}\n')
    local d = tmp()
    local out, rc = T.run_script('recipes/llama2_7b.lua', ('--init_from=%s --max_steps=2 --warmup_steps=1 --seq_len=8 '
      .. '--batch_size=2 --export_hf=%s/hf --checkpoint_dir=%s/ckpt --checkpoint_freq=2'):format(src, d, d))
    assert(rc == 0, out)
    out, rc = T.run_script('tools/export.lua', ('%s/ckpt %s/offline'):format(d, d))
    assert(rc == 0, out)
    for _, dir in ipairs({ d .. '/hf', d .. '/offline' }) do
      for _, name in ipairs({ 'tokenizer.json', 'tokenizer_config.json' }) do
        assert.equals(files.read(src .. '/' .. name), files.read(dir .. '/' .. name))
      end
      local gen = require('fsdp.io.json').decode(files.read(dir .. '/generation_config.json'))
      assert.same({ 2, 7 }, gen.eos_token_id)
      assert.equals(1, gen.bos_token_id)
    end
  end)

  it('refuse a T5 state dict whose shapes the options do not give, naming the tensor and both shapes', function()
    local d = tmp()
    fsdp.checkpointing.save_full_state_dict(d .. '/t5.safetensors', hf.from_pretrained(GOLDEN .. 't5_v1_1_tiny_v5'))
    local out, rc = T.run_script('recipes/t5_3b.lua', ('--init_from=%s/t5.safetensors'):format(d))
    assert(rc == 2, out)
    assert(out:find('t5.safetensors: shared.weight is [64, 16] there, [32128, 1024] in the t5 model configured', 1, true),
      out)
  end)

  it('train GPT-2 (llama2_7b.lua) and T5 from an HF directory and export what they trained', function()
    local d = tmp()
    local out, rc = T.run_script('recipes/llama2_7b.lua', ('--init_from=%s --max_steps=2 --warmup_steps=1 '
      .. '--seq_len=16 --batch_size=2 --export_hf=%s/gpt2 --save_full_state_dict=%s/gpt2.safetensors')
      :format(GOLDEN .. 'gpt2_tiny', d, d))
    assert(rc == 0, out)
    assert.matches('vocab 64: 28032 parameters, f32, gpt2', out, 1, true)
    assert.matches('init_from: loaded Hugging Face directory ' .. GOLDEN .. 'gpt2_tiny (gpt2)', out, 1, true)
    local exported = hf.from_pretrained(d .. '/gpt2')
    local trained = sharded(d .. '/gpt2.safetensors', { model = 'gpt2-tiny', num_heads = 4 })
    fsdp.sharding.summon_full_params(trained, function() params_equal(exported, trained, 'gpt2 trained') end)
    out, rc = T.run_script('recipes/t5_3b.lua', ('--init_from=%s --max_steps=2 --warmup_steps=1 --batch_size=2 '
      .. '--eval_examples=2 --export_hf=%s/t5'):format(GOLDEN .. 't5_v1_1_tiny_v5', d))
    assert(rc == 0, out)
    assert.matches('export: wrote ' .. d .. '/t5 (Hugging Face t5)', out, 1, true)
    assert.equals(3, hf.from_pretrained(d .. '/t5').config.num_decoder_layers)
  end)
end)
