-- generate_recipe_spec.lua: recipes/generate.lua end to end on a tiny
-- Llama: from a Hugging Face directory written by save_pretrained (and its
-- SentencePiece tokenizer.model or byte-level BPE tokenizer.json), from a sharded checkpoint (1 and 2
-- ranks) and a full state dict of a short llama2_7b.lua run; a GPT-2
-- state dict. The ids it prints are fsdp.generate's on the same weights,
-- the streamed text is the prompt and the decoded ids, and usage mistakes
-- are one line naming the option, before the model is loaded.
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'
local llama = require 'models.llama'
local hf = require 'models.hf'
local generate = require 'fsdp.generate'

local function run(args)
  local out, rc = T.run_script('recipes/generate.lua', args)
  return out, rc
end

-- ids[b] lines of the recipe's output, as lists.
local function printed_ids(out)
  local rows = {}
  for b, list in out:gmatch('ids%[(%d+)%]: ([%d,]+)') do
    local row = {}
    for id in list:gmatch('%d+') do row[#row + 1] = tonumber(id) end
    rows[tonumber(b)] = row
  end
  return rows
end

local function same_rows(got, want, what)
  assert(#got == #want, ('%s: %d rows, expected %d'):format(what, #got, #want))
  for b = 1, #want do
    assert(table.concat(got[b], ',') == table.concat(want[b], ','),
      ('%s row %d: {%s}, expected {%s}'):format(what, b, table.concat(got[b], ','), table.concat(want[b], ',')))
  end
end

describe('recipes/generate.lua', function()
  local dir = T.tmpdir()
  local hf_dir = dir .. '/hf'
  local model = llama.build('tiny', { vocab_size = 257 })
  model:init_weights({ seed = 5 })
  hf.save_pretrained(model, hf_dir)

  it('from a Hugging Face directory prints the ids fsdp.generate gives, a batch left-padded', function()
    local out, rc = run(('--init_from=%s --prompt_ids=%s --max_new_tokens=7 --print_ids'):format(
      T.quote(hf_dir), T.quote('3,1,4,1,5;9,2;6,5,3,5')))
    assert(rc == 0, out)
    local want = generate.generate(model, { { 3, 1, 4, 1, 5 }, { 9, 2 }, { 6, 5, 3, 5 } }, { max_new_tokens = 7 })
    same_rows(printed_ids(out), want, 'HF directory')
    assert.matches('generated 21 tokens for 3 prompts in', out)
  end)

  it('streams the text of one prompt with the byte tokenizer; sampling is seeded', function()
    local args = ('--init_from=%s --tokenizer=byte --prompt=%s --max_new_tokens=5 --print_ids --do_sample '
      .. '--top_k=20 --temperature=0.9 --seed=11'):format(T.quote(hf_dir), T.quote('Hi there'))
    local out, rc = run(args)
    assert(rc == 0, out)
    local want = generate.generate(model, { { 72, 105, 32, 116, 104, 101, 114, 101 } }, {
      max_new_tokens = 5, do_sample = true, top_k = 20, temperature = 0.9, seed = 11, stop_ids = { 256 } })
    same_rows(printed_ids(out), want, 'sampled')
    local tok = require('fsdp.data.byte_tokenizer').new()
    local text = 'Hi there' .. tok:decode(fsdp.tensor(want[1], { dtype = 'i64' }))
    assert(out:find(text .. '\n', 1, true), ('the streamed line is not %q:\n%s'):format(text, out))
    local again = run(args)
    same_rows(printed_ids(again), want, 'the same seed again')
  end)

  it("uses an HF directory's tokenizer.model: SentencePiece text streamed with its spaces", function()
    local spm = require 'fsdp.data.sentencepiece'
    local words = { 'once', 'upon', 'a', 'time', 'there', 'was', 'little', 'cat', 'who', 'sat', 'on', 'the', 'mat' }
    local lines = {}
    for i = 1, 400 do
      local l = {}
      for j = 1, 10 do l[j] = words[(i * 7 + j * j * 3) % #words + 1] end
      lines[i] = table.concat(l, ' ')
    end
    local corpus = dir .. '/corpus.txt'
    local f = assert(io.open(corpus, 'w'))
    f:write(table.concat(lines, '\n'), '\n')
    f:close()
    spm.train({ input = corpus, model_prefix = dir .. '/spm', vocab_size = 44, strict = true })
    local tok = spm.load(dir .. '/spm.model')
    local spm_dir = dir .. '/hf_spm'
    local m = llama.build('tiny', { vocab_size = tok.vocab_size })
    m:init_weights({ seed = 6 })
    hf.save_pretrained(m, spm_dir)
    os.execute(('cp %s %s'):format(T.quote(dir .. '/spm.model'), T.quote(spm_dir .. '/tokenizer.model')))
    local prompt = 'once upon a time'
    local out, rc = run(('--init_from=%s --prompt=%s --max_new_tokens=8 --print_ids --stop_ids=none')
      :format(T.quote(spm_dir), T.quote(prompt)))
    assert(rc == 0, out)
    local ids = tok:encode({ prompt }, { add_special = true })[1]:tolist()
    assert.equals(tok.bos_id, ids[1]) -- <s> first, as transformers' LlamaTokenizer
    local want = generate.generate(m, { ids }, { max_new_tokens = 8 })[1]
    same_rows(printed_ids(out), { want }, 'SentencePiece prompt')
    local all = {}
    for _, id in ipairs(ids) do all[#all + 1] = id end
    for _, id in ipairs(want) do all[#all + 1] = id end
    local text = tok:decode(fsdp.tensor(all, { dtype = 'i64' }))
    assert(out:find('\n' .. text .. '\n', 1, true), ('the streamed line is not %q:\n%s'):format(text, out))
  end)

  it("uses an HF directory's tokenizer.json: byte-level BPE with the template's <|begin_of_text|>", function()
    local bpe = require 'fsdp.data.bpe'
    local json_dir = dir .. '/hf_bpe'
    local tok = bpe.load('tests/golden/tokenizers/llama3_style.json')
    local m = llama.build('tiny', { vocab_size = tok.vocab_size })
    m:init_weights({ seed = 7 })
    hf.save_pretrained(m, json_dir)
    os.execute(('cp tests/golden/tokenizers/llama3_style.json %s'):format(T.quote(json_dir .. '/tokenizer.json')))
    local prompt = 'Grüße, wörld 42'
    local out, rc = run(('--init_from=%s --prompt=%s --max_new_tokens=8 --print_ids --stop_ids=none')
      :format(T.quote(json_dir), T.quote(prompt)))
    assert(rc == 0, out)
    local ids = tok:encode({ prompt }, { add_special = true })[1]:tolist()
    assert.equals(tok.bos_id, ids[1])
    local want = generate.generate(m, { ids }, { max_new_tokens = 8 })[1]
    same_rows(printed_ids(out), { want }, 'tokenizer.json prompt')
    local all = {}
    for _, id in ipairs(ids) do all[#all + 1] = id end
    for _, id in ipairs(want) do all[#all + 1] = id end
    -- shown without special tokens; a character the last token cuts is held back
    local text = tok:decode(all, { skip_special = true })
    while text:sub(-3) == '\239\191\189' do text = text:sub(1, -4) end
    assert.equals(prompt, text:sub(1, #prompt))
    assert(out:find('\n' .. text .. '\n', 1, true), ('the streamed line is not %q:\n%s'):format(text, out))
  end)

  it('refuses a tokenizer.json it does not implement before loading the model', function()
    local bad_dir = dir .. '/hf_wordpiece'
    hf.save_pretrained(model, bad_dir)
    local j = require('cjson').decode(assert(io.open('tests/golden/tokenizers/gpt2_style.json')):read('*a'))
    j.model.type = 'WordPiece'
    local f = assert(io.open(bad_dir .. '/tokenizer.json', 'w'))
    f:write(require('cjson').encode(j))
    f:close()
    local out, rc = run(('--init_from=%s --prompt=hi'):format(T.quote(bad_dir)))
    assert(rc == 1 and out:find(bad_dir .. '/tokenizer.json: model.type WordPiece is not implemented', 1, true), out)
    assert(not out:find('model: llama', 1, true), out)
  end)

  it('from a sharded checkpoint and a full state dict of a training run', function()
    local ckpt, full = dir .. '/ckpt', dir .. '/full.safetensors'
    local out, rc = T.run_script('recipes/llama2_7b.lua', ('--model=tiny --vocab_size=257 --seq_len=16 '
      .. '--batch_size=2 --max_steps=2 --warmup_steps=1 --val_batches=1 --checkpoint_dir=%s --checkpoint_freq=2 '
      .. '--save_full_state_dict=%s'):format(T.quote(ckpt), T.quote(full)))
    assert(rc == 0, out)
    local trained = llama.build('tiny', { vocab_size = 257 })
    fsdp.load_safetensors_into(trained, full)
    local want = generate.generate(trained, { { 10, 20, 30 }, { 7 } }, { max_new_tokens = 6 })
    -- the checkpoint records --model=tiny: its heads and RoPE settings
    out, rc = run(('--init_from=%s --prompt_ids=%s --max_new_tokens=6 --print_ids'):format(T.quote(ckpt),
      T.quote('10,20,30;7')))
    assert(rc == 0, out)
    assert.matches('model: llama from .*step%-000002', out)
    same_rows(printed_ids(out), want, 'sharded checkpoint')
    -- a state dict says nothing of heads: --model or --num_heads
    out, rc = run(('--init_from=%s --prompt_ids=1 --max_new_tokens=2'):format(T.quote(full)))
    assert(rc ~= 0 and out:find('give --model (a llama config name) or --num_heads', 1, true), out)
    out, rc = run(('--init_from=%s --num_heads=4 --prompt_ids=%s --max_new_tokens=6 --print_ids --no_cache')
      :format(T.quote(full), T.quote('10,20,30;7')))
    assert(rc == 0, out)
    same_rows(printed_ids(out), want, 'full state dict, no cache')
  end)

  it('from a checkpoint saved by 2 ranks (each parameter read from both rank files)', function()
    local _, has = T.sh('command -v mpirun')
    if has ~= 0 then
      pending('mpirun not found (openmpi-bin)')
      return
    end
    local ckpt, full = dir .. '/ckpt2', dir .. '/full2.safetensors'
    local host = require 'fsdp.host'
    -- Open MPI as root with more ranks than cores (TOOLCHAIN.md; tests/mpi/run.sh)
    local env = 'OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 '
      .. 'OMPI_MCA_btl_vader_single_copy_mechanism=none'
      -- Open MPI's own allocations are not ours to check (the lua-asan
      -- suite runs this through the sanitized executable)
      .. ' ASAN_OPTIONS=detect_leaks=0'
    local out, rc = T.sh(('%s timeout 180 mpirun -np 2 %s recipes/llama2_7b.lua --model=tiny --vocab_size=257 '
      .. '--seq_len=16 --batch_size=2 --max_steps=2 --warmup_steps=1 --val_batches=1 --checkpoint_dir=%s '
      .. '--checkpoint_freq=2 --save_full_state_dict=%s'):format(env, T.quote(host.exe), T.quote(ckpt), T.quote(full)))
    assert(rc == 0, out)
    local trained = llama.build('tiny', { vocab_size = 257 })
    fsdp.load_safetensors_into(trained, full)
    local want = generate.generate(trained, { { 10, 20, 30 }, { 7 } }, { max_new_tokens = 6 })
    out, rc = run(('--init_from=%s --prompt_ids=%s --max_new_tokens=6 --print_ids'):format(T.quote(ckpt),
      T.quote('10,20,30;7')))
    assert(rc == 0, out)
    same_rows(printed_ids(out), want, '2-rank checkpoint')
  end)

  it('from a GPT-2 state dict file (--model names its config)', function()
    local g = require('models.gpt2').build('tiny', { init_std = 0.5 })
    g:init_weights({ seed = 3 })
    local sd = {}
    for _, np in ipairs(g:named_parameters()) do sd[np[1]] = np[2] end
    local path = dir .. '/gpt2.safetensors'
    fsdp.save_safetensors(path, sd)
    local want = generate.generate(g, { { 1, 2, 3 }, { 9 } }, { max_new_tokens = 6 })
    local out, rc = run(('--init_from=%s --model=gpt2-tiny --prompt_ids=%s --max_new_tokens=6 --print_ids')
      :format(T.quote(path), T.quote('1,2,3;9')))
    assert(rc == 0, out)
    assert.matches('model: gpt2 from', out)
    same_rows(printed_ids(out), want, 'GPT-2 state dict')
  end)

  it('names the option at fault before loading anything', function()
    for _, case in ipairs({
      { ('--init_from=%s --prompt=hi'):format(T.quote(hf_dir)), '--prompt and --prompt_file need a tokenizer' },
      { ('--init_from=%s --prompt=hi --prompt_ids=1'):format(T.quote(hf_dir)), 'give exactly one of' },
      { ('--init_from=%s --prompt_ids=1,x'):format(T.quote(hf_dir)), '--prompt_ids: "x" is not a token id' },
      { ('--init_from=%s --prompt_ids=1 --model=tiny'):format(T.quote(hf_dir)), 'config.json gives the shapes' },
      { ('--init_from=%s --prompt_ids=1 --top_p=1.5'):format(T.quote(hf_dir)), '--top_p must be <= 1' },
      { ('--init_from=%s --prompt_ids=1,999'):format(T.quote(hf_dir)), "outside the model's vocabulary (257)" },
      { '--init_from=/no/such/dir --prompt_ids=1', '/no/such/dir does not exist' },
      { '--init_from=README.md --prompt_ids=1', 'not a Hugging Face directory (no config.json), a checkpoint' },
    }) do
      local out, rc = run(case[1])
      assert(rc ~= 0 and out:find(case[2], 1, true), ('%s: rc %d, output:\n%s'):format(case[1], rc, out))
      assert(not out:find('model: llama', 1, true) or case[2]:find('vocabulary'), out)
    end
  end)

  it('--help names the tokenizers it takes', function()
    local out, rc = run('--help')
    assert(rc == 0 and out:find("a tokenizer.json, an HF directory holding one", 1, true), out)
  end)

  teardown(function() os.execute('rm -rf ' .. T.quote(dir)) end)
end)
