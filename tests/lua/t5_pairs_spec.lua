-- tests/lua/t5_pairs_spec.lua: T5 fine-tuning on source/target JSONL pairs
-- (recipes/t5_3b.lua --data, models/t5_pairs.lua) with the example
-- dataset of docs/training.md (examples/summaries): on 2 ranks a tiny T5's
-- validation loss falls within 20 steps, the greedy outputs are printed as
-- text, and a run killed after step 12 and started again resumes from its
-- step-10 checkpoint (the data position in it) and logs exactly what the
-- uninterrupted run logged; a SentencePiece tokenizer (EOS 2, its unk
-- on the pad id) trains as well; the data mistakes a user makes (an empty
-- validation split, a tokenizer the vocabulary cannot hold, too few pairs
-- for one batch) are refused before anything is built.
local T = require 'fsdp.testing'
local host = require 'fsdp.host'

local TRAIN, VAL = 'examples/summaries/train.jsonl', 'examples/summaries/val.jsonl'

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

describe('examples/summaries', function()
  it('are the output of examples/summaries/make.lua (generated, deterministic)', function()
    local d = T.tmpdir()
    require('examples.summaries.make').make(d)
    for _, name in ipairs({ 'train.jsonl', 'val.jsonl' }) do
      assert(read(d .. '/' .. name) == read('examples/summaries/' .. name),
        'examples/summaries/' .. name .. ' differs from make.lua\'s output: run fsdp-lua examples/summaries/make.lua')
    end
    local n = select(2, read(TRAIN):gsub('\n', ''))
    assert.equals(400, n)
  end)
end)

describe('recipes/t5_3b.lua --data (source/target pairs)', function()
  local dir = T.tmpdir()
  local ARGS = ('--model=tiny --d_model=64 --d_ff=128 --num_heads=4 --d_kv=16 --data=%s --val_data=%s --batch_size=12 --max_steps=20 --warmup_steps=3 --lr=1e-2 '
    .. '--validation_freq=5 --log_every=1 --eval_examples=4 --checkpoint_freq=5 --resume_from_checkpoint'):format(
    TRAIN, VAL)

  -- The recipe on 2 ranks (Open MPI as root with more ranks than cores:
  -- TOOLCHAIN.md) with its own checkpoint directory; env: more variables.
  local function run2(name, env)
    local mpi_env = 'OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 '
      .. 'OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 '
      -- Open MPI's own allocations are not ours to check (lua-asan suite)
      .. 'ASAN_OPTIONS=detect_leaks=0 '
    return T.sh(('%s%s timeout -k 5 180 mpirun -np 2 %s recipes/t5_3b.lua %s --checkpoint_dir=%s'):format(
      mpi_env, env or '', T.quote(host.exe), ARGS, T.quote(dir .. '/' .. name)))
  end

  -- What a run logs from step `from` on: its step lines (less their
  -- speed and peak memory) and validation lines, and everything from the greedy outputs on.
  local function log_from(out, from)
    local lines, tail = {}, false
    for line in out:gmatch('[^\n]+') do
      line = line:gsub('^%[rank 0%] ', '') -- rank 0's lines of a 2-rank run (fsdp.console)
      tail = tail or line:match('^greedy outputs') ~= nil
      local step = tonumber(line:match('^Batch (%d+) ') or line:match('^Validation at batch (%d+):'))
      -- less what differs between processes: speed, and the peak memory
      -- (a resumed process has not run the validations before its start)
      line = line:gsub('Speed: [%d.]+ samples/sec, ', ''):gsub('peak memory: [%d.]+ %a+, ', '')
      if tail or (step and step >= from) then lines[#lines + 1] = line end
    end
    return table.concat(lines, '\n')
  end

  local mpirun = select(2, T.sh('command -v mpirun')) == 0
  local ref

  it('on 2 ranks: the validation loss falls, greedy outputs are printed as text', function()
    if not mpirun then return pending('mpirun not found (openmpi-bin)') end
    local out, rc = run2('ref')
    assert(rc == 0, out)
    ref = out
    assert.matches('data: TextPairs(' .. TRAIN .. ', train: 400 pairs', out, 1, true)
    assert.matches('validation: ' .. VAL .. ', 48 pairs; 2 batches of 12 per rank (48 pairs) every 5 steps', out, 1,
      true)
    assert.is_nil(out:find('truncated', 1, true))
    local v = {}
    for step, loss in out:gmatch('Validation at batch (%d+): loss ([%d.]+)') do v[tonumber(step)] = tonumber(loss) end
    assert(v[5] and v[10] and v[15] and v[20], out)
    -- byte-level chance is ln(257) = 5.55; measured 4.20, 3.60, 3.18, 3.03
    assert(v[20] < 0.8 * v[5] and v[10] < v[5], ('validation losses %s, %s, %s, %s'):format(v[5], v[10], v[15], v[20]))
    assert.matches('greedy outputs on validation sources (after step 20):', out, 1, true)
    -- the first validation pair, as text
    assert.matches('  source:    In a close game on', out, 1, true)
    assert.matches('  reference: ', out, 1, true)
    assert.matches('  generated: ', out, 1, true)
    assert.matches('validation exact match: %d+ / 4', out)
  end)

  it('killed after step 12 and started again: resumes at step 10 and logs what the uninterrupted run did', function()
    if not mpirun then return pending('mpirun not found (openmpi-bin)') end
    assert(ref, 'needs the uninterrupted run of the test before')
    local out, rc = run2('crash', 'FSDP_TEST_KILL_AT_STEP=12')
    assert(rc ~= 0 and out:match('Batch 12 Loss') and not out:match('Batch 13 Loss'), out)
    out, rc = run2('crash')
    assert(rc == 0, out)
    assert.matches('resumed from [^\n]*step%-000010', out)
    -- steps 11..20 crossing the epoch (16 steps of 24 pairs), validations, outputs
    local want, got = log_from(ref, 11), log_from(out, 11)
    assert.matches('Batch 17 Loss', want, 1, true)
    assert.equals(want, got)
  end)

  local function run1(args) return T.run_script('recipes/t5_3b.lua', '--model=tiny ' .. args) end

  it('with a SentencePiece tokenizer (pad id 0 is its unk, EOS 2): the loss falls, outputs are text', function()
    local spm = require 'fsdp.data.sentencepiece'
    -- a subword model of the pairs' text, one line per source and target
    local cjson = require 'cjson'
    local text = dir .. '/pairs.txt'
    local f = assert(io.open(text, 'w'))
    for line in io.lines(TRAIN) do
      local p = cjson.decode(line)
      f:write(p.source, '\n', p.target, '\n')
    end
    f:close()
    local model = spm.train({ input = text, model_prefix = dir .. '/spm', vocab_size = 300 })
    local out, rc = run1(('--d_model=64 --d_ff=128 --num_heads=4 --d_kv=16 --data=%s --val_data=%s --tokenizer=%s '
      .. '--source_len=48 --target_len=24 --max_steps=30 --warmup_steps=3 --lr=1e-2 --validation_freq=10 '
      .. '--eval_examples=4'):format(TRAIN, VAL, model))
    assert.equals(0, rc, out)
    assert.matches('SentencePiece(' .. model, out, 1, true)
    local v = {}
    for step, loss in out:gmatch('Validation at batch (%d+): loss ([%d.]+)') do v[tonumber(step)] = tonumber(loss) end
    -- measured 3.06, 2.24, 1.92 (chance: ln(294) = 5.68)
    assert(v[10] and v[30] and v[30] < 0.8 * v[10], out)
    assert.matches('  reference: Pilots 5-1 Hawks', out, 1, true)
  end)

  it('refuse an empty validation split, a tokenizer too large for --vocab_size, too few pairs', function()
    local small = dir .. '/small.jsonl'
    local f = assert(io.open(small, 'w'))
    for i = 1, 5 do f:write(('{"source": "text %d", "target": "%d"}\n'):format(i, i)) end
    f:close()
    local out, rc = run1('--data=' .. small)
    assert.equals(2, rc, out)
    assert.matches(('--data: %s: the val split is empty (5 pairs in the file, val_fraction 0.1); give '
      .. '--val_data=FILE or a larger --val_fraction'):format(small), out, 1, true)
    out, rc = run1('--data=' .. small .. ' --val_fraction=0.5 --batch_size=4')
    assert.equals(2, rc, out)
    assert.matches('--data: ' .. small .. ' (train split, 3 pairs): 3 examples are fewer than one global batch of 4',
      out, 1, true)
    out, rc = run1(('--data=%s --val_data=%s --vocab_size=100'):format(TRAIN, VAL))
    assert.equals(2, rc, out)
    assert.matches('--vocab_size (100) is smaller than the vocabulary of --tokenizer byte (257)', out, 1, true)
    out, rc = run1(('--data=%s --tokenizer=%s'):format(TRAIN, dir .. '/none.model'))
    assert.equals(2, rc, out)
    assert.matches('--tokenizer ' .. dir .. '/none.model: ', out, 1, true)
    out, rc = run1('--val_data=' .. VAL)
    assert.equals(2, rc, out)
    assert.matches('--val_data needs --data', out, 1, true)
  end)
end)
