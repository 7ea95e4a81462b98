-- cpu_isa_spec.lua: the CPU backend's instruction-set level ([Note: CPU
-- ISA levels], core/base/cpu_isa.c), from the outside. The level the core
-- detects is checked against /proc/cpuinfo's flags read here; every level
-- this CPU offers runs a tiny Llama's forward and backward in a child
-- process (FSDP_CPU_ISA fixes the level per process), whose f32 loss and
-- gradient norm must agree with the f64 run to f32 rounding and whose
-- kernels (OpenBLAS's, oneDNN's, attention's) must stay within the level;
-- a level the CPU lacks, or no level, is one line and exit status 2.
-- The loops compiled once per level ([Note: ISA clones], core/base/
-- cpu_isa_dispatch.h) are run at every level in a child that calls each
-- family, which must report the variant of that level, and whose exact
-- results (conversions, optimizer updates) must be the same bits at every
-- level.
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'

local rank = {}
for i, name in ipairs(fsdp.cpu_isa_levels) do rank[name] = i end

-- The CPU's level from its flags, independently of the core's cpuid
-- reading (AMX also needs the kernel's grant: where the flags show tiles
-- the core may still stop at avx512_bf16, and says why).
local function cpu_level_from_flags()
  local f = io.open('/proc/cpuinfo')
  local info = f and f:read('*a') or ''
  if f then f:close() end
  local flags = {}
  for flag in (info:match('\nflags%s*:([^\n]*)') or ''):gmatch('%S+') do flags[flag] = true end
  if not (flags.avx2 and flags.fma) then return 'baseline' end
  if not (flags.avx512f and flags.avx512bw and flags.avx512dq and flags.avx512vl) then return 'avx2' end
  if not flags.avx512_bf16 then return 'avx512' end
  if not (flags.amx_bf16 and flags.amx_tile) then return 'avx512_bf16' end
  return 'amx'
end

-- A tiny Llama's loss and gradient norm in `dtype` at `level`, with the
-- kernels each library and attention ran, from a child process. OpenBLAS
-- picks its kernels as it loads: the child starts without a core type,
-- so the host's own cap is what is seen.
local probe = [[
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local dtype = ...
local c = llama.config('tiny', { dim = 128, n_heads = 4, n_kv_heads = 2, ffn_dim = 256, vocab_size = 256, n_layers = 2 })
local model = llama.build(c, { dtype = dtype })
model:init_weights({ seed = 7 })
local ids = fsdp.randint(0, c.vocab_size, { 2, 64 }, { seed = 1 })
local targets = fsdp.randint(0, c.vocab_size, { 2, 64 }, { seed = 2 })
local loss = model:loss(ids, targets)
loss:backward()
local sq = 0
for _, p in ipairs(model:parameters()) do local g = p.grad:to('f64'); sq = sq + fsdp.F.sum(g * g):item() end
local ffi = require 'ffi'
ffi.cdef 'char *openblas_get_corename(void);'
print(('%.17g %.17g'):format(loss:item(), math.sqrt(sq)))
print(fsdp.cpu_isa().level)
print(ffi.string(ffi.C.openblas_get_corename()))
print(fsdp.cpu_attention_kernel())
print(fsdp.cpu_gemm_library())
]]
local function run_probe(level, dtype)
  local dir = T.tmpdir()
  local script = dir .. '/probe.lua'
  local f = assert(io.open(script, 'w'))
  f:write(probe)
  f:close()
  local out, rc = T.sh(('env -u OPENBLAS_CORETYPE FSDP_CPU_ISA=%s timeout 120 %s %s %s'):format(
    level, T.quote(require('fsdp.host').exe), T.quote(script), dtype))
  os.remove(script)
  os.remove(dir)
  assert.equals(0, rc, out)
  local loss, norm, got_level, core, attention, gemm = out:match('^([^ ]+) ([^\n]+)\n([^\n]+)\n([^\n]+)\n([^\n]+)\n([^\n]+)\n$')
  assert.is_truthy(loss, out)
  return { loss = tonumber(loss), norm = tonumber(norm), level = got_level, core = core,
           attention = attention, gemm = gemm }
end

local function rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-30) end

-- The widest variant of [Note: ISA clones] the CPU can run, from its
-- flags: arch=x86-64-v4 needs all of v3 and AVX-512 F, BW, CD, DQ, VL;
-- v3 needs AVX2, FMA, BMI1/2, F16C, LZCNT (abm) and MOVBE.
local function clone_cap_from_flags()
  local f = io.open('/proc/cpuinfo')
  local info = f and f:read('*a') or ''
  if f then f:close() end
  local flags = {}
  for flag in (info:match('\nflags%s*:([^\n]*)') or ''):gmatch('%S+') do flags[flag] = true end
  local function all(list)
    for _, x in ipairs(list) do if not flags[x] then return false end end
    return true
  end
  if not all({ 'avx2', 'fma', 'bmi1', 'bmi2', 'f16c', 'abm', 'movbe' }) then return 'baseline' end
  if not all({ 'avx512f', 'avx512bw', 'avx512cd', 'avx512dq', 'avx512vl' }) then return 'avx2' end
  return 'avx512'
end

-- Calls every family of [Note: ISA clones] (each fast dtype pair of
-- fl_convert, the three updates, unary math and silu * up forward and
-- backward, the row loops of softmax, cross-entropy and attention in f32
-- and f64), prints the f64 digests of the exact results (conversions and
-- IEEE-rounded updates are the same bits at any vector width), then one
-- line per family: name, widest, ran.
local clones_probe = [[
local fsdp = require 'fsdp'
local F, nn, optim = fsdp.F, require 'fsdp.nn', require 'fsdp.optim'
local digests = {}
local function digest(t)
  local w = fsdp.randn(t.shape, { seed = #digests, dtype = 'f64' })
  digests[#digests + 1] = ('%.17g'):format(F.sum(t:to('f64') * w):item())
end
-- More than one parallel chunk (2^16), and a tail the vectors do not fill.
local x = fsdp.randn({ 100003 }, { seed = 3 }) * 300
for _, d in ipairs({ 'bf16', 'f16', 'f64', 'i32', 'i64' }) do
  local y = x:to(d)
  digest(y)
  digest(y:to('f32'))
end
for _, d in ipairs({ 'bf16', 'f16' }) do digest(x:to('f64'):to(d):to('f64')) end
for _, make in ipairs({
  function(p) return optim.AdamW({ { 'p', p } }, { lr = 0.01, weight_decay = 0.1 }) end,
  function(p) return optim.AnyPrecisionAdamW({ { 'p', p } }, { lr = 0.01, momentum_dtype = 'f32',
                                                                variance_dtype = 'f32' }) end,
  function(p) return optim.Adadelta({ { 'p', p } }, { weight_decay = 0.01 }) end }) do
  local p = nn.Parameter(fsdp.randn({ 5003 }, { seed = 4 }))
  local opt = make(p)
  for s = 1, 3 do
    p.grad = fsdp.randn({ 5003 }, { seed = 10 + s })
    opt:step()
  end
  digest(p)
end
for _, dt in ipairs({ 'f32', 'f64' }) do
  local a = fsdp.randn({ 4, 37 }, { seed = 5, dtype = dt }):requires_grad_(true)
  local b = fsdp.randn({ 4, 37 }, { seed = 6, dtype = dt }):requires_grad_(true)
  local q = fsdp.randn({ 1, 2, 9, 16 }, { seed = 8, dtype = dt }):requires_grad_(true)
  local loss = F.sum(F.gelu(a) * F.silu_mul(a, b)) + F.sum(F.softmax(a) * b) + F.sum(F.log_softmax(b) * a)
    + F.cross_entropy(a, fsdp.randint(0, 37, { 4 }, { seed = 7 }))
    + F.sum(F.scaled_dot_product_attention(q, q, q, { causal = true }))
    + F.sum(F.scaled_dot_product_attention(q, q, q, { causal = true, softcap = 2 }))
  loss:backward()
end
print(table.concat(digests, ' '))
for _, c in ipairs(fsdp.cpu_isa_clones()) do print(c.name, c.widest, c.ran or 'none') end
]]
local function run_clones_probe(level)
  local dir = T.tmpdir()
  local script = dir .. '/clones.lua'
  local f = assert(io.open(script, 'w'))
  f:write(clones_probe)
  f:close()
  local out, rc = T.sh(('FSDP_CPU_ISA=%s timeout 120 %s %s'):format(level, T.quote(require('fsdp.host').exe),
                                                                   T.quote(script)))
  os.remove(script)
  os.remove(dir)
  assert.equals(0, rc, out)
  local digests, families = out:match('^([^\n]*)\n'), {}
  for name, widest, ran in out:gmatch('\n([^\t\n]+)\t(%S+)\t(%S+)') do
    families[#families + 1] = { name = name, widest = widest, ran = ran }
  end
  return digests, families
end

describe('the CPU ISA level', function()
  local isa = fsdp.cpu_isa()
  local env = os.getenv('FSDP_CPU_ISA')

  it('is what the CPU offers, capped by FSDP_CPU_ISA', function()
    local flags_level = cpu_level_from_flags()
    if flags_level == 'amx' and isa.cpu == 'avx512_bf16' then
      assert.is_truthy(fsdp.cpu_attention_kernel():find('AMX: the kernel refused the AMX tile state', 1, true))
    else
      assert.equals(flags_level, isa.cpu)
    end
    local want = (env and env ~= '' and env ~= 'auto') and env or isa.cpu
    assert.equals(want, isa.level)
    assert.is_truthy(isa.text:find(isa.level, 1, true) == 1, isa.text)
  end)

  it('is printed by --version', function()
    local out, rc = T.sh(T.quote(require('fsdp.host').exe) .. ' --version')
    assert.equals(0, rc, out)
    assert.is_truthy(out:find('\ncpu: ' .. isa.level, 1, true), out)
  end)

  it("is in a recipe's first lines and in every record of its metrics", function()
    local dir = T.tmpdir()
    local out, rc = T.run_script('recipes/llama2_7b.lua', ('--num_layers=1 --hidden_width=64 --num_heads=2 '
      .. '--vocab_size=128 --seq_len=16 --batch_size=2 --max_steps=2 --warmup_steps=0 --log_every=1 '
      .. '--metrics_file=%s/m.jsonl'):format(dir), 60)
    assert.equals(0, rc, out)
    assert.is_truthy(out:find('\ndevice: cpu, ISA ' .. isa.text .. '\n', 1, true), out)
    local records = 0
    for line in io.lines(dir .. '/m.jsonl') do
      if line:find('"type":"train"', 1, true) then
        records = records + 1
        assert.is_truthy(line:find('"cpu_isa":"' .. isa.level .. '"', 1, true), line)
      end
    end
    assert.equals(2, records)
    os.remove(dir .. '/m.jsonl')
    os.remove(dir)
  end)

  it('refuses a level the CPU lacks, and no level, in one line with exit status 2', function()
    local exe = T.quote(require('fsdp.host').exe)
    local out, rc = T.sh('FSDP_CPU_ISA=avx1024 ' .. exe .. " -e 'print(1)'")
    assert.equals(2, rc, out)
    assert.equals('fsdp-lua: FSDP_CPU_ISA=avx1024: no such level (known: auto, avx2, avx512, avx512_bf16, amx)\n', out)
    if isa.cpu ~= 'amx' then
      local above = fsdp.cpu_isa_levels[rank[isa.cpu] + 1]
      out, rc = T.sh(('FSDP_CPU_ISA=%s %s -e "print(1)"'):format(above, exe))
      assert.equals(2, rc, out)
      assert.is_truthy(out:match('^fsdp%-lua: FSDP_CPU_ISA=' .. above .. ': this CPU cannot run it %(.+; its level is '
        .. isa.cpu .. '%)\n$'), out)
    end
  end)

  describe('the loops compiled per level ([Note: ISA clones])', function()
    local cap = clone_cap_from_flags()
    local digests
    for i = rank.avx2, rank[isa.cpu] or 0 do
      local level = fsdp.cpu_isa_levels[i]
      it(level .. ': every family runs the variant of the level, with the same exact results', function()
        local got, families = run_clones_probe(level)
        -- conversions, dtype.c; three updates, core/optim; four in
        -- cpu_unary.c; the row loops of cpu_softmax.c, cpu_loss.c and
        -- cpu_attention.c (with its softcap) in f32 and f64
        assert.is_true(#families >= 14 + 3 + 4 + 3 * 4 + 2, ('%d families'):format(#families))
        for _, f in ipairs(families) do
          local want = math.min(rank[f.widest], i, rank[cap])
          assert.equals(f.name .. ' at ' .. level .. ': ' .. fsdp.cpu_isa_levels[want],
                        f.name .. ' at ' .. level .. ': ' .. f.ran)
        end
        digests = digests or got
        assert.equals(digests, got)
      end)
    end
  end)

  describe('at every level the CPU offers', function()
    -- f64 is the reference: its kernels are the same at every level.
    local reference
    for i = rank.avx2, rank[isa.cpu] or 0 do
      local level = fsdp.cpu_isa_levels[i]
      it(level .. ': f32 and bf16 agree with f64 to their rounding, on kernels within the level', function()
        reference = reference or run_probe('auto', 'f64')
        local r32, r16 = run_probe(level, 'f32'), run_probe(level, 'bf16')
        assert.equals(level, r32.level)
        -- f32: sums of at most a few hundred terms, each rounded to f32
        -- (2^-24 relative): n 2^-24 < 1.6e-5 even if every rounding
        -- went one way.
        assert.is_true(rel(r32.loss, reference.loss) < 256 * 2^-24, ('f32 loss %.9g, f64 %.9g'):format(r32.loss, reference.loss))
        assert.is_true(rel(r32.norm, reference.norm) < 256 * 2^-24, ('f32 grad norm %.9g, f64 %.9g'):format(r32.norm, reference.norm))
        -- bf16: the loss is a bf16 value (8 bits: within 2^-8 of f64's);
        -- the gradients carry bf16 rounding of every activation.
        assert.is_true(rel(r16.loss, reference.loss) < 2^-8, ('bf16 loss %.9g, f64 %.9g'):format(r16.loss, reference.loss))
        assert.is_true(rel(r16.norm, reference.norm) < 2^-6, ('bf16 grad norm %.9g, f64 %.9g'):format(r16.norm, reference.norm))
        -- The kernels: OpenBLAS's AVX-512 sets only from avx512; bf16
        -- attention on dot products or tiles only from avx512_bf16;
        -- oneDNN's bf16 products only from avx512_bf16 ([Note: the bf16
        -- routes], core/cpu/cpu_matmul.c).
        local wide_core = ({ skylakex = true, cooperlake = true, sapphirerapids = true })[r32.core:lower()]
        if i < rank.avx512 then assert.is_falsy(wide_core, r32.core) end
        if i < rank.avx512_bf16 then
          assert.is_truthy(r32.attention:match('^f32 blocks'), r32.attention)
        else
          assert.is_falsy(r32.attention:match('^f32 blocks'), r32.attention)
        end
        if r32.gemm:match('^oneDNN') then
          assert.equals(i >= rank.avx512_bf16, r32.gemm:match('^oneDNN [%d.]+ %(bf16 products') ~= nil, r32.gemm)
        end
      end)
    end
  end)
end)
