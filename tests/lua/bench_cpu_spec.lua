-- bench_cpu_spec.lua: the CPU benchmarks cpu_compare.sh runs on our side.
-- benchmarks/fma_peak.c, the f32 multiply-add peak (and
-- the AVX512-BF16 dot-product peak) that benchmarks/cpu_compare.sh prints
-- as the ceilings of the comparison. It is built here as cpu_compare.sh
-- builds it (the system's cc, 256-bit FMA always, 512-bit where the CPU has
-- AVX-512, with the bf16 dot products where it has AVX512-BF16) and must
-- print its RESULT line with the threads it ran on and the vector width it
-- was built for, and the bf16 rate only when built for it: each step adds
-- two products per lane, so it is above the f32 rate.
local cjson = require 'cjson'

local function cpu_has(flag)
  local f = io.open('/proc/cpuinfo')
  if not f then return false end
  local text = f:read('*a')
  f:close()
  return text:match('%f[%w]' .. flag .. '%f[%W]') ~= nil
end

local function sh(cmd)
  local p = io.popen(cmd .. ' 2>&1')
  local out = p:read('*a')
  local ok, _, rc = p:close()
  return out, (ok == true or ok == 0) and 0 or (rc or 1)
end

local dir = os.tmpname()
os.remove(dir)

describe('benchmarks/fma_peak.c', function()
  setup(function() assert(os.execute('mkdir -p ' .. dir)) end)
  teardown(function() os.execute('rm -rf ' .. dir) end)

  local variants = { { '-mfma', 256, 'fma' }, { '-mavx512f', 512, 'avx512f' },
                    { '-mavx512f -mavx512bf16', 512, 'avx512_bf16' } }
  for _, v in ipairs(variants) do
    local flag, bits, cpu_flag = v[1], v[2], v[3]
    local bf16 = cpu_flag == 'avx512_bf16'
    if not cpu_has(cpu_flag) then
      pending(('%s: this CPU has no %s, not built'):format(flag, cpu_flag))
    else
      it(('builds with %s and reports a %d-bit rate on 2 threads'):format(flag, bits), function()
        local exe = dir .. '/fma_peak' .. bits .. (bf16 and '_bf16' or '')
        local out, rc = sh(('cc -O2 -fopenmp %s benchmarks/fma_peak.c -o %s'):format(flag, exe))
        assert.equals(0, rc, out)
        out, rc = sh('OMP_NUM_THREADS=2 ' .. exe)
        assert.equals(0, rc, out)
        local r = cjson.decode((assert(out:match('RESULT (%b{})'), out)))
        assert.equals(2, r.threads)
        assert.equals(bits, r.vector_bits)
        assert.is_true(r.fma_peak_gflops > 0, out)
        assert.truthy(out:match(('f32 multiply%%-add peak: [%%d.]+ GFLOP/s %%(2 threads, %d%%-bit'):format(bits)), out)
        if bf16 then
          assert.is_true(r.bf16_dot_peak_gflops > r.fma_peak_gflops, out)
          assert.truthy(out:match('bf16 dot%-product peak %(vdpbf16ps%): [%d.]+ GFLOP/s'), out)
        else
          assert.is_nil(r.bf16_dot_peak_gflops, out)
        end
      end)
    end
  end
end)

-- benchmarks/train_step.lua, the fsdp-lua side of cpu_compare.sh: one
-- step of the small Llama, its ops traced, must end with the GEMM floor
-- (the issue's: the model's FLOPs at the GEMM rate measured in the run,
-- plus AdamW's 28 bytes per parameter at the memory's rate) and the RESULT
-- line cpu_compare.sh reads, floor_ms included.
describe('benchmarks/train_step.lua', function()
  local fsdp = require 'fsdp'
  if fsdp.build_info:find('asan', 1, true) then
    pending('a step of the 58M-parameter Llama takes minutes in the sanitized build (the lua suite runs it)')
    return
  end
  it('prints the step, its ops, the GEMM floor and a RESULT line with floor_ms', function()
    local out, rc = sh('OMP_NUM_THREADS=2 build/bin/fsdp-lua benchmarks/train_step.lua --only=llama --steps=1 '
      .. '--warmup=0 --ops=3')
    assert.equals(0, rc, out)
    local r = cjson.decode((assert(out:match('RESULT (%b{})'), out)))
    assert.equals('fsdp-lua', r.impl)
    assert.equals(58073600, r.params)
    assert.is_true(r.ms > 0 and r.sgemm_gflops > 0, out)
    -- the floor: products at the rate, AdamW at the memory's rate (the
    -- RESULT's unrounded numbers; the printed line rounds them)
    local function near(a, b) return math.abs(a - b) <= 1e-9 * math.max(1, math.abs(b)) end
    assert.is_true(r.product_gflops > 0 and r.memory_gbs > 0, out)
    assert.is_true(near(r.floor_products_ms, r.model_gflop / r.product_gflops * 1e3), out)
    assert.is_true(near(r.floor_adamw_ms, 28 * r.params / (r.memory_gbs * 1e9) * 1e3), out)
    assert.is_true(near(r.floor_ms, r.floor_products_ms + r.floor_adamw_ms), out)
    assert.truthy(out:match('GEMM floor %d+ ms %([%d.]+ GFLOP at %d+ GFLOP/s: %d+ ms; AdamW, 28 B x 58073600 '
      .. 'parameters at [%d.]+ GB/s: %d+ ms%); the step runs at %d+%% of it'), out)
    assert.truthy(out:match('one traced step [%d.]+ ms: products'), out)
  end)
end)
