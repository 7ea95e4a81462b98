-- device_option_spec.lua: the recipes' --device option (fsdp.sharding.device)
-- in a build or on a machine without a GPU: auto trains on the CPU with the
-- CPU's defaults, cuda and cuda:N are refused before anything is built (exit
-- 2, one line naming --device and why), bad values are named; options whose
-- default depends on others (fsdp.options's default_from) keep what the user
-- gave, on the command line or in --config; the CUDA device names map to the
-- planner's profiles; the GPU defaults (on a stubbed GPU). The training on
-- cuda itself is the cudasim suite's
-- (tests/cudasim/recipes.sh).
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'
local files = require 'fsdp.io.files'
local options = require 'fsdp.options'
local device = require 'fsdp.sharding.device'

local GPU = fsdp.cuda.is_available()

local tmp
setup(function() tmp = T.tmpdir() end)
teardown(function() if tmp then os.execute('rm -rf ' .. T.quote(tmp)) end end)

-- `fsdp-lua <args>` from the project root: exit status, stdout, stderr.
local run = T.run_exe

local SMALL = '--num_layers=1 --hidden_width=32 --num_heads=2 --vocab_size=64 --seq_len=8 --batch_size=2 '
  .. '--max_steps=2 --warmup_steps=1 --validation_freq=0'

describe('--device without a GPU', function()
  if GPU then
    pending('this build sees a GPU (' .. fsdp.cuda.status() .. '): the cudasim suite covers --device there')
    return
  end

  it('auto (the default) trains on the CPU with the CPU defaults', function()
    local rc, out, err = run('recipes/llama2_7b.lua ' .. SMALL)
    assert.equals(0, rc, err)
    -- the config dump shows what differs from the defaults: on the CPU these keep theirs
    for _, key in ipairs({ 'device', 'mixed_precision', 'plan_device', 'peak_tflops' }) do
      assert.is_nil(out:find('\n  ' .. key .. ' = ', 1, true), key)
    end
    local _, printed = run('recipes/llama2_7b.lua --print_config ' .. SMALL)
    for _, line in ipairs({ 'device: "auto"', 'mixed_precision: ""', 'plan_device: "cpu"', 'peak_tflops: 0' }) do
      assert.matches('\n' .. line .. '\n', printed, 1, true)
    end
    assert.matches('compute f32, reduce f32', out, 1, true)
    assert.matches('Batch 2 Loss: [%d.]+, .*peak memory: [%d.]+ MiB', out)
    assert.is_nil(out:find('device: cuda', 1, true))
  end)

  -- {recipe and options, what the one line on stderr says}
  local CASES = {
    { 'recipes/llama2_7b.lua --device=cuda', '--device (cuda) asks for a GPU, but there is none here (' },
    { 'recipes/llama2_7b.lua --device=cuda:0', '--device (cuda:0) asks for a GPU, but there is none here (' },
    { 'recipes/deepvit_8b.lua --device=cuda', '--device (cuda) asks for a GPU, but there is none here (' },
    { 'recipes/t5_3b.lua --device=cuda', '--device (cuda) asks for a GPU, but there is none here (' },
    { 'recipes/mnist.lua --device=cuda', '--device (cuda) asks for a GPU, but there is none here (' },
    { 'recipes/generate.lua --model=tiny --prompt_ids=1 --device=cuda', '--device (cuda) asks for a GPU, but there is none here (' },
    { 'recipes/llama2_7b.lua --device=gpu', "--device must be auto, cpu, cuda or cuda:N; got 'gpu'" },
    { 'recipes/llama2_7b.lua --device=cdua', "got 'cdua' (did you mean cuda?)" },
    { 'recipes/llama2_7b.lua --device=cuda:x', "--device must be auto, cpu, cuda or cuda:N; got 'cuda:x'" },
    { 'recipes/llama2_7b.lua --device=cuda:-1', "got 'cuda:-1'" },
    { 'recipes/mnist.lua --device=', "--device must be auto, cpu, cuda or cuda:N; got ''" },
  }
  for _, case in ipairs(CASES) do
    it('refuses ' .. case[1], function()
      local rc, out, err = run(case[1])
      assert.equals(2, rc, out .. err)
      assert.equals('', out)
      local line = err:match('^fsdp%-lua: ([^\n]*)\n$')
      assert.is_truthy(line, 'one line on stderr: ' .. err)
      assert.matches(case[2], line, 1, true)
      if case[2]:find('there is none here') then
        assert.matches('use --device=cpu or --device=auto', line, 1, true)
      end
    end)
  end

  it('refuses before anything is built: no checkpoint directory is made', function()
    run('recipes/llama2_7b.lua --device=cuda --checkpoint_dir=' .. T.quote(tmp .. '/not-made'))
    assert.is_nil(files.mode(tmp .. '/not-made'))
  end)

  it('resolves the values (cpu, auto) and names the device of a config', function()
    assert.equals('cpu', device.resolve({ device = 'cpu' }))
    assert.equals('cpu', device.resolve({ device = 'auto' }))
    assert.is_false(device.is_cuda({ device = 'auto' }))
    assert.is_nil(device.profile({ device = 'auto' }))
    assert.has_error(function() device.resolve({ device = 'cuda:3' }) end)
  end)
end)

-- Where bf16 is slower than f32 on the CPU (below the avx512_bf16 level:
-- no bf16 dot products, [Note: the bf16 routes], core/cpu/cpu_matmul.c),
-- a CPU recipe's device line says so, with the advice; elsewhere, and for
-- f32, it names the level alone. Checked at the level in force and in
-- child processes capped at each lower level from avx2.
describe("the device line's word on bf16 on the CPU", function()
  if GPU then
    pending('this build sees a GPU (' .. fsdp.cuda.status() .. '): recipes default to it')
    return
  end
  local rank, isa = {}, fsdp.cpu_isa()
  for i, name in ipairs(fsdp.cpu_isa_levels) do rank[name] = i end

  it('is there for bf16 below avx512_bf16 only', function()
    local slow = rank[isa.level] < rank.avx512_bf16
    local note = device.cpu_precision_note({ device = 'cpu', mixed_precision = 'bf16' })
    assert.equals(slow, note ~= nil)
    if slow then
      assert.equals(('bf16 is slower than f32 at the %s level (no bf16 dot products: its products run in f32 after '
        .. 'conversions); train in f32 for speed, bf16 only to save memory'):format(isa.level), note)
    end
    assert.equals(slow, device.cpu_precision_note({ device = 'cpu', dtype = 'bf16' }) ~= nil)
    assert.is_nil(device.cpu_precision_note({ device = 'cpu', dtype = 'f32' }))
    assert.is_nil(device.cpu_precision_note({ device = 'cpu', dtype = 'f32', mixed_precision = '' }))
    assert.equals('cpu, ISA ' .. isa.text .. (note and '; ' .. note or ''),
      device.describe({ device = 'cpu', mixed_precision = 'bf16' }))
    assert.equals('cpu, ISA ' .. isa.text, device.describe({ device = 'cpu', mixed_precision = '' }))
  end)

  it("is in a bf16 recipe's first lines at each level from avx2 to the CPU's", function()
    for level = rank.avx2, rank[isa.cpu] do
      local name = fsdp.cpu_isa_levels[level]
      local out, rc = T.sh(('FSDP_CPU_ISA=%s timeout 120 %s recipes/llama2_7b.lua %s --device=cpu '
        .. '--mixed_precision=bf16'):format(name, T.quote(require('fsdp.host').exe), SMALL))
      assert.equals(0, rc, out)
      local line = out:match('\ndevice: ([^\n]*)')
      assert.is_truthy(line, out)
      assert.equals(level < rank.avx512_bf16, line:find('; bf16 is slower than f32 at the ' .. name .. ' level', 1,
        true) ~= nil, line)
    end
  end)
end)

describe('defaults that depend on other options (default_from)', function()
  local spec = {
    device = { 'auto', 'where' },
    mixed_precision = { '', 'compute dtype', one_of = { '', 'bf16', 'f32' },
                        default_from = function(cfg) if cfg.device == 'gpu-like' then return 'bf16' end end },
    peak = { 0, 'peak', min = 0, default_from = function(cfg) return cfg.mixed_precision == 'bf16' and 989 or nil end },
    broken = { '', 'x', one_of = { '', 'a' }, default_from = function(cfg) if cfg.device == 'bad' then return 'z' end end },
    refusing = { '', 'y', default_from = function(cfg)
      if cfg.device == 'refuse' then return nil, 'is needed here' end
    end },
  }

  it('computes an option the user did not give, in key order, and keeps one given', function()
    local cfg = options.parse(spec, { '--device=gpu-like' }, 'x.lua')
    assert.equals('bf16', cfg.mixed_precision)
    assert.equals(989, cfg.peak)  -- reads mixed_precision, which sorts before it
    cfg = options.parse(spec, { '--device=gpu-like', '--mixed_precision=' }, 'x.lua')
    assert.equals('', cfg.mixed_precision)
    assert.equals(0, cfg.peak)
    cfg = options.parse(spec, { '--device=gpu-like', '--peak=5' }, 'x.lua')
    assert.equals(5, cfg.peak)
    cfg = options.parse(spec, { '--device=cpu' }, 'x.lua')
    assert.equals('', cfg.mixed_precision)
  end)

  it('keeps a value given in a --config file', function()
    local path = tmp .. '/opts.lua'
    files.write_atomic(path, "return { mixed_precision = 'f32' }")
    local cfg = options.parse(spec, { '--device=gpu-like', '--config=' .. path }, 'x.lua')
    assert.equals('f32', cfg.mixed_precision)
  end)

  it('checks a computed value and names the option when it cannot be computed', function()
    local ok, err = pcall(options.parse, spec, { '--device=bad' }, 'x.lua')
    assert.is_false(ok)
    assert.matches("--broken (default from the other options) must be one of", err, 1, true)
    ok, err = pcall(options.parse, spec, { '--device=refuse' }, 'x.lua')
    assert.is_false(ok)
    assert.equals('--refusing is needed here', err)
  end)
end)

describe('the GPU defaults', function()
  -- On a GPU (stubbed: this spec runs where there may be none) whose
  -- profile fsdp.devices knows, and on one it does not.
  local saved = {}
  local function on_gpu(profile)
    saved.is_cuda, saved.profile = device.is_cuda, device.profile
    device.is_cuda = function() return true end
    device.profile = function() return profile and fsdp.devices[profile] or nil end
  end
  after_each(function()
    if saved.is_cuda then device.is_cuda, device.profile = saved.is_cuda, saved.profile end
    saved = {}
  end)

  it('are bf16, the GPU\'s profile for --plan and its peak in the compute dtype for MFU', function()
    on_gpu('h100-80g')
    assert.equals('bf16', device.default_mixed_precision({}))
    assert.equals('h100-80g', device.default_plan_device({ plan = true }))
    assert.equals(989, device.default_peak_tflops({ mixed_precision = 'bf16', dtype = 'f32' }))
    assert.equals(67, device.default_peak_tflops({ mixed_precision = '', dtype = 'f32' }))
    assert.is_nil(device.default_peak_tflops({ mixed_precision = '', dtype = 'f64' }))
  end)

  it('on a GPU without a profile: no MFU, and --plan asks for --plan_device', function()
    on_gpu(nil)
    assert.is_nil(device.default_peak_tflops({ mixed_precision = 'bf16' }))
    assert.is_nil(device.default_plan_device({ plan = false }))
    local v, why = device.default_plan_device({ plan = true })
    assert.is_nil(v)
    assert.matches('is needed with --plan on this GPU', why, 1, true)
  end)

  it('are nothing on the CPU', function()
    if GPU then return pending('this build sees a GPU') end
    local cfg = { device = 'auto', mixed_precision = '', dtype = 'f32', plan = true }
    assert.is_nil(device.default_mixed_precision(cfg))
    assert.is_nil(device.default_plan_device(cfg))
    assert.is_nil(device.default_peak_tflops(cfg))
  end)
end)

describe('fsdp.devices.for_cuda', function()
  it('maps CUDA device names to the planner\'s profiles', function()
    local cases = {
      { 'NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)', 'h100-80g' },
      { 'NVIDIA H200 (sm_90, 139.8 GiB)', 'h200-141g' },
      { 'NVIDIA A100-SXM4-80GB (sm_80, 79.2 GiB)', 'a100-80g' },
      { 'NVIDIA A100-SXM4-40GB (sm_80, 39.4 GiB)', 'a100-40g' },
      { 'NVIDIA L40S (sm_89, 44.4 GiB)', 'l40s-48g' },
    }
    for _, c in ipairs(cases) do
      local p = fsdp.devices.for_cuda(c[1])
      assert.is_truthy(p, c[1])
      assert.equals(c[2], p.name, c[1])
    end
    assert.is_nil(fsdp.devices.for_cuda('cudasim (kernels simulated on the CPU) (sm_90, 8.0 GiB)'))
    assert.is_nil(fsdp.devices.for_cuda('no usable CUDA device: CUDA driver version is insufficient (35)'))
    assert.is_nil(fsdp.devices.for_cuda(nil))
  end)

  it('is not listed as a profile', function()
    for _, name in ipairs(fsdp.devices.names()) do assert.are_not.equal('for_cuda', name) end
  end)
end)
