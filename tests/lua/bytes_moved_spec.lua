-- bytes_moved_spec.lua: the bytes-moved counter ([Note: bytes moved] in
-- core/base/flops.h): each memory-bound op counts the operands it reads
-- and the outputs it writes once, on every device; GEMMs are not counted;
-- a training step counts the same bytes op by op on cpu, on meta (where
-- nothing runs) and on cuda:0 (a GPU, or the cudasim build); and
-- benchmarks/step_bytes.lua's table adds up.
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local T = require 'fsdp.testing'

local function by_op()
  local t = {}
  for _, e in ipairs(fsdp.bytes_moved_by_op()) do t[e.op] = e end
  return t
end

describe('fsdp.bytes_moved', function()
  before_each(function() fsdp.reset_bytes_moved() end)

  it('counts a broadcast add as its operands at their own sizes plus the output', function()
    local a, b = fsdp.randn({ 4, 8 }), fsdp.randn({ 8 }, { dtype = 'bf16' })
    fsdp.reset_bytes_moved()
    local c = a + b -- f32 out
    assert.equals(4 * 8 * 4 + 8 * 2 + 4 * 8 * 4, fsdp.bytes_moved())
    local e = by_op().add
    assert.same({ op = 'add', calls = 1, bytes = 272 }, e)
    c:add_(a) -- in place: a read, c read and written
    assert.equals(272 + 3 * 128, fsdp.bytes_moved())
  end)

  it('counts copies and casts as source and destination, and not GEMMs', function()
    local x = fsdp.randn({ 16, 32 })
    local w = fsdp.randn({ 32, 32 })
    fsdp.reset_bytes_moved()
    local y = x:matmul(w)
    assert.equals(0, fsdp.bytes_moved())
    local h = y:to('bf16')
    assert.equals(16 * 32 * (4 + 2), fsdp.bytes_moved())
    local t = h:t():contiguous()
    assert.equals(16 * 32 * (4 + 2) + 16 * 32 * 4, fsdp.bytes_moved())
    assert.equals(2, by_op().copy.calls)
    fsdp.reset_bytes_moved()
    assert.equals(0, fsdp.bytes_moved())
    assert.same({}, fsdp.bytes_moved_by_op())
  end)

  it('counts the optimizer: every operand read, all but the gradient written', function()
    local p = fsdp.randn({ 100 }, { requires_grad = true })
    p.grad = fsdp.randn({ 100 })
    local opt = optim.AdamW({ { 'p', p } }, { lr = 1e-3 })
    fsdp.reset_bytes_moved()
    opt:step()
    -- p, grad, exp_avg, exp_avg_sq read (4 x 400), p and the two moments written (3 x 400)
    assert.equals(7 * 400, by_op().adamw.bytes)
  end)

  -- One step of a tiny Llama on a device: the counts per op.
  local function step_counts(device)
    local c = llama.config('tiny')
    local model = llama.build(c, { device = device })
    if device ~= 'meta' then model:init_weights({ seed = 1 }) end
    local opt = optim.AdamW(model:named_parameters(), { lr = 1e-3 })
    local ids = device == 'meta' and fsdp.empty({ 2, 16 }, { dtype = 'i64', device = 'meta' })
      or fsdp.randint(0, c.vocab_size, { 2, 16 }, { seed = 3, device = device })
    local targets = device == 'meta' and fsdp.empty({ 2, 16 }, { dtype = 'i64', device = 'meta' })
      or fsdp.randint(0, c.vocab_size, { 2, 16 }, { seed = 4, device = device })
    fsdp.reset_bytes_moved()
    local loss = model:loss(ids, targets)
    loss:backward()
    opt:step()
    opt:zero_grad()
    local counts = by_op()
    fsdp.reset_bytes_moved()
    return counts
  end

  it('counts a training step the same on meta as on the cpu, op by op', function()
    local cpu, meta = step_counts('cpu'), step_counts('meta')
    assert.is_true(cpu.add.bytes > 0 and cpu.adamw.calls > 0 and cpu.rms_norm.calls > 0)
    assert.same(cpu, meta)
  end)

  local test = fsdp.cuda.device_count() > 0 and it or pending
  test('counts a training step the same on cuda:0 as on the cpu', function()
    assert.same(step_counts('cpu'), step_counts('cuda:0'))
  end)
end)

describe('benchmarks/step_bytes.lua', function()
  it('tabulates a step on meta whose rows add up to its total', function()
    local out, rc = T.run_script('benchmarks/step_bytes.lua', '--model=tiny --batch=2 --seq=16', 30)
    assert.equals(0, rc, out)
    local sum = 0
    for gb in out:gmatch('\n[%w_ ]-%s+%d+%s+([%d.]+)%s+[%d.]+%%') do sum = sum + tonumber(gb) end
    local all = tonumber(out:match('\nall%s+([%d.]+)'))
    assert.is_true(all > 0, out)
    assert.near(all, sum, 0.002 * 20, out)
  end)
end)
