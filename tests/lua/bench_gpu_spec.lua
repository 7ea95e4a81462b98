-- bench_gpu_spec.lua: issue 7's GPU benchmark pair, checked where no GPU is:
-- benchmarks/llama_gpu.lua runs on cpu with a tiny Llama and its RESULT line
-- carries the model's own numbers (parameters, FLOPs per token, batch);
-- --find_batch under a memory cap finds the largest batch by catching
-- out-of-memory errors; benchmarks/llama_torch.py (PyTorch eager) is run
-- the same way where torch is installed, and must count the same
-- parameters. On a GPU, run benchmarks/gpu_compare.sh instead.
local T = require 'fsdp.testing'
local llama = require 'models.llama'
local cjson = require 'cjson'

local function result_of(out)
  local line = out:match('\nRESULT (%b{})') or out:match('^RESULT (%b{})')
  assert(line, 'no RESULT line in:\n' .. out)
  return cjson.decode(line)
end

local TINY = '--device=cpu --model=tiny --seq=64 --steps=2 --warmup=1'

describe('benchmarks/llama_gpu.lua on cpu', function()
  it('trains the tiny Llama and reports its numbers in RESULT', function()
    local out, rc = T.run_script('benchmarks/llama_gpu.lua', TINY .. ' --batch=2', 60)
    assert.equals(0, rc, out)
    local r = result_of(out)
    local c = llama.config('tiny')
    assert.equals('fsdp-lua', r.impl)
    assert.equals(llama.closed_form_parameters(c), r.params)
    assert.equals(llama.flops_per_token(c, 64), r.flops_per_token)
    assert.equals(2, r.batch)
    assert.equals(64, r.seq)
    assert.is_true(r.tokens_per_s > 0 and r.step_ms > 0)
    assert.near(r.flops_per_token * r.tokens_per_s / 989e12, r.mfu, 1e-12)
    assert.is_true(r.peak_bytes > 0)
    -- Random tokens over 256 ids: the loss starts near ln 256.
    assert.is_true(math.abs(r.loss_first - math.log(256)) < 0.3, tostring(r.loss_first))
  end)

  it('finds the largest batch under a memory cap', function()
    local out, rc = T.run_script('benchmarks/llama_gpu.lua', TINY .. ' --find_batch --memory_limit_mb=12', 60)
    assert.equals(0, rc, out)
    assert.truthy(out:find('is out of memory', 1, true), out)
    local r = result_of(out)
    assert.is_true(r.batch > 1 and r.batch < 1024, tostring(r.batch))
    assert.is_true(r.peak_bytes <= 12 * 2^20, tostring(r.peak_bytes))
  end)

  it('names an unknown model', function()
    local out, rc = T.run_script('benchmarks/llama_gpu.lua', '--device=cpu --model=nope', 30)
    assert.is_not.equals(0, rc)
    assert.truthy(out:find("unknown config 'nope'", 1, true), out)
  end)
end)

describe('benchmarks/llama_torch.py on cpu', function()
  local _, has_torch = T.sh('python3 -c "import torch" >/dev/null 2>&1')
  if has_torch ~= 0 then
    pending('PyTorch is not installed here: llama_torch.py runs where it is (the GPU machine)')
    return
  end
  it('counts the same parameters as fsdp-lua and reports RESULT', function()
    local out, rc = T.sh('timeout 120 python3 benchmarks/llama_torch.py ' .. TINY .. ' --batch=2')
    assert.equals(0, rc, out)
    local r = result_of(out)
    assert.equals(llama.closed_form_parameters(llama.config('tiny')), r.params)
    assert.equals(llama.flops_per_token(llama.config('tiny'), 64), r.flops_per_token)
    assert.is_true(math.abs(r.loss_first - math.log(256)) < 0.3, tostring(r.loss_first))
  end)
end)
