-- cuda_launches_spec.lua: fsdp.cuda.launches(), the CUDA backend's count
-- of its kernel launches ([Note: kernel launches counted] in
-- core/cuda/cuda_common.cuh: one per fl_cu_check). In the cudasim build the
-- simulator counts the launches it is asked for by itself, so a training
-- step of a small Llama in f32 and bf16 (forward, backward, clipping, the
-- AdamW step) and a checkpointed one must give both counts equal: a launch
-- site without its check, or a check without a launch, shows here. And
-- the multi-tensor AdamW: a step of many whole tensors of one dtype is one
-- launch per batch of 76 ([Note: multi-tensor updates] in
-- core/cuda/cuda_optim.cu), where one launch per tensor it was. Pending
-- without a GPU.
local fsdp = require 'fsdp'
local ffi = require 'ffi'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local C = require('fsdp.core').C
local cptr = require('fsdp.tensor').cptr

local CUDA = fsdp.cuda.is_available()
local DEV = 'cuda:0'
local SIM = fsdp.cuda.simulated()

describe('cuda kernel launches', function()
  if not CUDA then
    pending('no GPU here (' .. fsdp.cuda.status() .. '): the launch count was not checked')
    return
  end

  -- The launches fn() makes, and the simulator's count of them (nil on a GPU).
  local function launches_of(fn)
    fsdp.cuda.synchronize()
    fsdp.cuda.reset_launches()
    local made0, seen0 = fsdp.cuda.launches()
    assert.equals(0, made0)
    if SIM then assert.equals(0, seen0) end
    fn()
    fsdp.cuda.synchronize()
    return fsdp.cuda.launches()
  end

  local function train_step(dtype, checkpointing)
    local c = llama.config('tiny', { n_layers = 2, vocab_size = 128 })
    local m = llama.build(c, { device = DEV, dtype = dtype })
    m:init_weights({ seed = 3 })
    if checkpointing then fsdp.checkpoint(m, function(x) return x:is_instance_of(llama.DecoderLayer) end) end
    local opt = optim.AdamW(m:named_parameters(), { lr = 1e-2, weight_decay = 0.1 })
    local ids = fsdp.randint(0, 128, { 2, 16 }, { seed = 10 }):to(DEV)
    local targets = fsdp.randint(0, 128, { 2, 16 }, { seed = 11 }):to(DEV)
    return function()
      local loss = m:loss(ids, targets)
      loss:backward()
      optim.clip.clip_grad_norm_(m, 1.0)
      opt:step()
      opt:zero_grad()
      loss:item()
    end
  end

  it('counts every launch of a training step, as the simulator does', function()
    for _, case in ipairs({ { 'f32', false }, { 'bf16', false }, { 'bf16', true } }) do
      local step = train_step(case[1], case[2])
      local made, seen = launches_of(step)
      assert(made > 50, ('%s: only %d launches counted'):format(case[1], made))
      if SIM then
        assert(made == seen, ('%s%s: the backend counted %d launches, the simulator saw %d')
          :format(case[1], case[2] and ' checkpointed' or '', made, seen))
      end
    end
  end)

  it('steps many whole tensors of one dtype in one launch per batch of 76', function()
    local o = ffi.new('fl_adamw_options')
    o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.step = 1e-3, 0.9, 0.95, 1e-8, 0.1, 1
    for _, case in ipairs({ { 3, 1 }, { 76, 1 }, { 77, 2 }, { 160, 3 } }) do
      local n, want = case[1], case[2]
      local keep, a = {}, { ffi.new('fl_tensor *[?]', n), ffi.new('const fl_tensor *[?]', n),
                            ffi.new('fl_tensor *[?]', n), ffi.new('fl_tensor *[?]', n) }
      for i = 1, n do
        local size = { 8 * i + 3 }
        local t = { fsdp.randn(size, { seed = i, device = DEV, dtype = 'bf16' }),
                    fsdp.randn(size, { seed = 1000 + i, device = DEV, dtype = 'bf16' }),
                    fsdp.zeros(size, { device = DEV, dtype = 'bf16' }),
                    fsdp.zeros(size, { device = DEV, dtype = 'bf16' }) }
        keep[i] = t
        for k = 1, 4 do a[k][i - 1] = cptr(t[k]) end
      end
      local made, seen = launches_of(function()
        assert(C.fl_adamw_step_multi_(n, a[1], a[2], a[3], a[4], o) == 0, require('fsdp.core').last_error())
      end)
      assert.equals(want, made, ('%d tensors'):format(n))
      if SIM then assert.equals(made, seen) end
    end
  end)

  it('runs an AdamW step of a model with whole parameters in few launches', function()
    local c = llama.config('tiny', { n_layers = 2, vocab_size = 128 })
    local m = llama.build(c, { device = DEV, dtype = 'bf16' })
    m:init_weights({ seed = 3 })
    local params = m:named_parameters()
    local opt = optim.AdamW(params, { lr = 1e-2 })
    for _, np in ipairs(params) do np[2].grad = fsdp.zeros(np[2].shape, { device = DEV, dtype = np[2].dtype }) end
    local made = launches_of(function() opt:step() end)
    -- one batch per 76 tensors (all bf16, fresh allocations: 16-byte aligned)
    assert.equals(math.ceil(#params / 76), made, ('%d parameters'):format(#params))
  end)
end)
