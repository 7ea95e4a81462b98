-- cuda_offload_spec.lua: activation offload (fsdp.offload_activations).
-- On the CPU: offload changes nothing (no copies, the same gradients), the
-- predicate interface and its errors, the scope closed after an error, and
-- the recipes' --offload_activations option.
-- On cuda:0: a small Llama trained with its decoder layers offloaded gives
-- the losses and gradients of the plain run bit for bit, holds less device
-- memory after forward by at least 90% of the bytes it moved, copies a
-- view saved by several nodes once, never moves a parameter (plain,
-- transposed, or a sharded unit's), and composes with activation
-- checkpointing in either order. The copies to CPU memory run on a copy
-- stream (deferred under cudasim, so each ordering below fails there when
-- it is missing): the copy back waits for its copy to the host, and the
-- device and pinned blocks a queued copy uses are not reused before it
-- ran, in backward and in a forward dropped without one. The device half
-- is pending without a GPU and runs in the cudasim build; run it with
-- FSDP_CUDASIM_QUERY_DELAY=2 as well (event queries then say "not yet").
-- The copies back are prefetched on the copy stream too
-- (FSDP_OFFLOAD_PREFETCH entries ahead): the compute stream waits for each
-- before using it, and a prefetched block dropped unused (a branch
-- backward does not run) is not reused before its copy ran.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'

local C = fsdp.C
local CUDA = fsdp.cuda.is_available()
local DEV = 'cuda:0'
local normalised_error = require('fsdp.testing').normalised_error

local function is_layer(m) return m:is_instance_of(llama.DecoderLayer) end

-- fl_offload_stats.prefetched (not in fsdp.cuda.offload_stats' table).
local ffi = require 'ffi'
local stats_buf = ffi.new('fl_offload_stats')
local function prefetched()
  C.fl_offload_stats_get(stats_buf)
  return tonumber(stats_buf.prefetched)
end

-- Runs fn with FSDP_OFFLOAD_PREFETCH set to `window` (nil: unset, the
-- default), then puts back what the environment had.
pcall(ffi.cdef, 'int setenv(const char *name, const char *value, int overwrite);')
pcall(ffi.cdef, 'int unsetenv(const char *name);')
local function set_window(window)
  if window then ffi.C.setenv('FSDP_OFFLOAD_PREFETCH', tostring(window), 1)
  else ffi.C.unsetenv('FSDP_OFFLOAD_PREFETCH') end
end
local function with_window(window, fn)
  local was = os.getenv('FSDP_OFFLOAD_PREFETCH')
  set_window(window)
  local ok, a, b = pcall(fn)
  set_window(was)
  if not ok then error(a, 0) end
  return a, b
end

local VOCAB, B, T = 128, 2, 48

local function build(device, opts)
  opts = opts or {}
  local c = llama.config('tiny', { n_layers = opts.layers or 2, vocab_size = VOCAB })
  local m = llama.build(c, { device = device, dtype = opts.dtype or 'f32' })
  m:init_weights({ seed = 3 })
  return m
end

local function batch(device, seed)
  return fsdp.randint(0, VOCAB, { B, T }, { seed = seed }):to(device),
         fsdp.randint(0, VOCAB, { B, T }, { seed = seed + 1 }):to(device)
end

-- Losses of `steps` AdamW steps and the gradients of the last one.
local function train(device, steps, prepare, opts)
  local m = build(device, opts)
  if prepare then prepare(m) end
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-2, weight_decay = 0.1 })
  local ids, targets = batch(device, 10)
  local losses, grads = {}, {}
  for step = 1, steps do
    local loss = m:loss(ids, targets)
    loss:backward()
    if step == steps then
      for _, np in ipairs(m:named_parameters()) do grads[np[1]] = np[2].grad:cpu() end
    end
    opt:step()
    opt:zero_grad()
    losses[step] = loss:item()
  end
  return losses, grads
end

local function assert_identical(got, want, what)
  local n = 0
  for name, g in pairs(want) do
    assert(got[name], what .. ': no gradient for ' .. name)
    assert.equals(0, normalised_error(got[name], g), what .. ': ' .. name)
    n = n + 1
  end
  assert.is_true(n > 0, what .. ': no gradients compared')
end

local raises = require('fsdp.testing').raises

describe('offload_activations on the CPU', function()
  it('wraps the matching modules outermost first and changes nothing on the cpu', function()
    local plain_losses, plain = train('cpu', 2)
    fsdp.cuda.reset_offload_stats()
    local wrapped
    local losses, grads = train('cpu', 2, function(m)
      wrapped = fsdp.offload_activations(m, is_layer)
    end)
    assert.same({ 'model.layers.0', 'model.layers.1' }, wrapped)
    assert.same(plain_losses, losses)
    assert_identical(grads, plain, 'cpu')
    local st = fsdp.cuda.offload_stats()
    assert.equals(0, st.copies)
    assert.equals(0, st.saved)
    assert.is_true(st.kept > 0, 'the cpu tensors saved in the scope are counted as kept')
  end)

  it('takes every = k, and a match inside a wrapped module is covered', function()
    local m = build('cpu', { layers = 4 })
    assert.same({ 'model.layers.0', 'model.layers.2' },
      fsdp.offload_activations(m, is_layer, { every = 2 }))
    local m2 = build('cpu')
    assert.same({ '' }, fsdp.offload_activations(m2, function() return true end))
  end)

  it('names what is wrong', function()
    local m = build('cpu')
    raises(function() fsdp.offload_activations(42, is_layer) end, 'offload_activations: expects a module first')
    raises(function() fsdp.offload_activations(m, 'layers') end, 'expects a predicate function')
    raises(function() fsdp.offload_activations(m, is_layer, 3) end, 'options must be a table')
    raises(function() fsdp.offload_activations(m, is_layer, { every = 0 }) end,
      'every must be a positive integer, got 0')
    raises(function() fsdp.offload_activations(m, is_layer, { evry = 2 }) end, "unknown option 'evry'")
  end)

  it('closes its scope when the forward raises', function()
    local Bad = nn.Module:extend('Bad')
    function Bad:forward() error('broken forward') end
    local m = Bad()
    fsdp.offload_activations(m, function() return true end)
    raises(function() m(fsdp.zeros({ 2 })) end, 'broken forward')
    assert.equals(0, C.fl_offload_depth())
    assert.equals(C.FL_ERR_STATE, C.fl_offload_end())
    assert.truthy(fsdp.C.fl_last_error() ~= nil)
    assert.equals('offload_end: no offload scope is open', require('ffi').string(C.fl_last_error()))
  end)
end)

describe('the recipes\' --offload_activations', function()
  local run = require('fsdp.testing').run_script

  it('offloads the blocks (with checkpointing too) and rejects a value that is not a boolean', function()
    local args = '--depth=1 --dim=32 --heads=2 --mlp_dim=64 --image_size=32 --num_classes=4 '
      .. '--max_steps=2 --batch_size=2 --offload_activations --activation_checkpointing'
    local out, rc = run('recipes/deepvit_8b.lua', args)
    assert.equals(0, rc, out)
    assert.matches('checkpointed blocks, activations offloaded to pinned CPU memory', out, 1, true)
    assert.matches('Batch 2 Loss: ', out, 1, true)
    out, rc = run('recipes/deepvit_8b.lua', '--offload_activations=maybe --dry-run')
    assert.equals(2, rc, out)
    assert.matches('--offload_activations expects true or false, got "maybe"', out, 1, true)
  end)
end)

describe('offload_activations on cuda:0', function()
  if not CUDA then
    pending('no GPU here (' .. fsdp.cuda.status() .. '): activation offload was not run')
    return
  end

  it('gives each checkpoint recompute of one shared input its own leaf', function()
    -- h is saved (packed) by two checkpoints in one scope: one entry, two
    -- unpacks; sharing the restored tensor would add both recomputes'
    -- gradients into one .grad.
    local autograd, offload = require 'fsdp.autograd', require 'fsdp.activations.offload'
    local function run(scoped)
      local x = fsdp.randn({ 4, 8 }, { seed = 1, device = DEV }):requires_grad_(true)
      local w = fsdp.randn({ 8, 8 }, { seed = 2, device = DEV }):requires_grad_(true)
      local function body()
        local h = x * 2
        local a = autograd.checkpoint_with_params({ w }, function(t) return t:matmul(w):tanh() end, h)
        local b = autograd.checkpoint_with_params({ w }, function(t) return t:matmul(w):sigmoid() end, h)
        return (a + b):sum()
      end
      local loss = scoped and offload.scoped(body) or body()
      loss:backward()
      return x.grad:to('cpu'), w.grad:to('cpu')
    end
    local want_x, want_w = run(false)
    fsdp.cuda.reset_offload_stats()
    local got_x, got_w = run(true)
    assert.is_true(fsdp.cuda.offload_stats().copies >= 1, 'the shared input was offloaded')
    assert.equals(0, normalised_error(got_x, want_x))
    assert.equals(0, normalised_error(got_w, want_w))
  end)

  it('trains with the plain run\'s losses and gradients, bit for bit', function()
    local want_losses, want = train(DEV, 3)
    fsdp.cuda.reset_offload_stats()
    local losses, grads = with_window(nil, function()
      return train(DEV, 3, function(m) fsdp.offload_activations(m, is_layer) end)
    end)
    assert.same(want_losses, losses)
    assert_identical(grads, want, 'offload')
    local st = fsdp.cuda.offload_stats()
    assert.is_true(st.copies > 0 and st.bytes > 0, 'something was offloaded')
    assert.equals(st.copies, st.restores, 'every copy came back once')
    assert.equals(st.bytes, st.restored_bytes)
    assert.equals(0, st.failed)
    -- within a layer each node's entries were started at an earlier node's
    -- unpack; only each step's first offloaded node in backward (one per
    -- layer: the layers are separate scopes) copies its own back
    assert.is_true(prefetched() > st.restores / 2, 'most copies back were prefetched: '
      .. prefetched() .. ' of ' .. st.restores)
  end)

  it('gives the same in bf16', function()
    local want_losses, want = train(DEV, 2, nil, { dtype = 'bf16' })
    local losses, grads = train(DEV, 2, function(m) fsdp.offload_activations(m, is_layer) end,
      { dtype = 'bf16' })
    assert.same(want_losses, losses)
    assert_identical(grads, want, 'offload bf16')
  end)

  -- Device bytes in use after forward, and what the scope moved.
  local function after_forward(prepare)
    local m = build(DEV, { layers = 4 })
    if prepare then prepare(m) end
    local ids, targets = batch(DEV, 1)
    local was = fsdp.set_collect_budget(0)
    collectgarbage()
    collectgarbage()
    local before = fsdp.memory_stats(DEV).in_use
    fsdp.cuda.reset_offload_stats()
    local loss = m:loss(ids, targets)
    collectgarbage()
    collectgarbage()
    local held = fsdp.memory_stats(DEV).in_use - before
    local st = fsdp.cuda.offload_stats()
    loss:backward()
    fsdp.set_collect_budget(was)
    return held, st
  end

  it('holds less device memory after forward, by at least 90% of what it moved', function()
    local plain = after_forward()
    local held, st = after_forward(function(m) fsdp.offload_activations(m, is_layer) end)
    print(('\n# device bytes held after forward: %d plain, %d offloaded (%d bytes moved to pinned CPU memory)')
      :format(plain, held, st.bytes))
    assert.is_true(st.bytes > 0)
    assert(plain - held >= 0.9 * st.bytes, ('saved %d bytes of device memory for %d moved')
      :format(plain - held, st.bytes))
    assert.is_true(held < plain / 2, 'the decoder layers\' activations were most of it')
  end)

  it('copies a view saved by several nodes once (q, k, v on one input)', function()
    local Proj = nn.Module:extend('Proj')
    function Proj:__init()
      self.q = nn.Linear(16, 8, { device = DEV })
      self.k = nn.Linear(16, 8, { device = DEV })
      self.v = nn.Linear(16, 8, { device = DEV })
    end
    function Proj:forward(x) return self.q(x) + self.k(x) + self.v(x) end
    local m = Proj()
    m:init_weights({ seed = 1 })
    fsdp.offload_activations(m, function() return true end)
    local x = fsdp.randn({ 4, 16 }, { seed = 2 }):to(DEV) * 2 -- computed: not a leaf
    fsdp.cuda.reset_offload_stats()
    local y = m(x)
    local st = fsdp.cuda.offload_stats()
    assert.equals(3, st.saved)
    assert.equals(1, st.copies)
    assert.equals(2, st.shared)
    assert.equals(4 * 16 * 4, st.bytes, 'only x, once')
    assert.equals(3, st.kept_params, 'the three weights stayed')
    y:sum():backward()
    assert.equals(1, fsdp.cuda.offload_stats().restores)
  end)

  it('moves views as their span: a transpose and a broadcast as they are, a view with gaps densely', function()
    local Views = nn.Module:extend('Views')
    function Views:forward(x, s)
      local a = (x * 2):t()                      -- [16, 4], strides {1, 16}
      local part = x:narrow(1, 2, 8)             -- [4, 8] with gaps in x's rows
      local b = s:expand(4, 8)                   -- [4, 8] broadcast of a [1, 8] row
      return (a * a):sum() + (part * b):sum()    -- saves a twice (shared), part and b
    end
    local function run(offload)
      local m = Views()
      if offload then fsdp.offload_activations(m, function() return true end) end
      -- leaves that require grad (and their views) would stay: computed inputs
      local x0 = fsdp.randn({ 4, 16 }, { seed = 5 }):to(DEV):requires_grad_(true)
      local s0 = fsdp.randn({ 1, 8 }, { seed = 6 }):to(DEV):requires_grad_(true)
      fsdp.cuda.reset_offload_stats()
      local y = m(x0 * 3, s0 * 3)
      local st = fsdp.cuda.offload_stats()
      y:backward()
      return { x = x0.grad:cpu(), s = s0.grad:cpu() }, st
    end
    local want = run(false)
    local got, st = run(true)
    assert_identical(got, want, 'views')
    -- a: 64 elements (a transpose: its dense span, restored with the same
    -- strides) once for its two saves; part:
    -- 32 elements made dense (its span, 4 rows of 16, has gaps); b: its
    -- [1, 8] row only
    assert.equals(4, st.saved)
    assert.equals(3, st.copies)
    assert.equals(1, st.shared)
    assert.equals((64 + 32 + 8) * 4, st.bytes)
  end)

  it('never moves a parameter, nor a view of one', function()
    local w = fsdp.randn({ 8, 16 }, { seed = 3 }):to(DEV):requires_grad_(true)
    local Mul = nn.Module:extend('Mul')
    function Mul:forward(x) return x:matmul(w:t()) * w:sum() end
    local m = Mul()
    fsdp.offload_activations(m, function() return true end)
    local x = fsdp.randn({ 4, 16 }, { seed = 4 }):to(DEV) + 1
    fsdp.cuda.reset_offload_stats()
    local y = m(x)
    local st = fsdp.cuda.offload_stats()
    assert.equals(4 * 16 * 4 + 4 * 8 * 4 + 4, st.bytes, 'x, the product and the scalar sum: no weight bytes')
    assert.is_true(st.kept_params >= 1, 'w:t() was kept')
    y:sum():backward()
    assert.is_truthy(w.grad, 'the weight got its gradient')
  end)

  it('never moves a sharded unit\'s gathered parameters, and trains as without it', function()
    local function sharded(prepare)
      local c = llama.config('tiny', { n_layers = 2, vocab_size = VOCAB })
      local m = llama.CausalLM(c, { device = 'meta' })
      fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 5, device = DEV })
      if prepare then prepare(m) end
      local ids, targets = batch(DEV, 20)
      fsdp.cuda.reset_offload_stats()
      local loss = m:loss(ids, targets)
      local st = fsdp.cuda.offload_stats()
      loss:backward()
      local grads = {}
      for _, np in ipairs(m:named_parameters()) do grads[np[1]] = np[2].grad:cpu() end
      return loss:item(), grads, st
    end
    local want_loss, want = sharded()
    local loss, grads, st = sharded(function(m) fsdp.offload_activations(m, is_layer) end)
    assert.equals(want_loss, loss)
    assert_identical(grads, want, 'sharded')
    assert.is_true(st.copies > 0)
    assert.is_true(st.kept_params > 0, 'the gathered weights were saved and kept')
  end)

  -- [Note: offload streams] in core/autograd/offload.c. Under cudasim the
  -- copy stream runs only when something forces it, so each test below
  -- gets wrong values where one ordering is missing.

  -- x0's gradient through Sq, a module whose saved h = x0 * 3 is offloaded;
  -- between forward and backward, `between` may run. With keep, the module
  -- holds h, so no block the copy read is freed before backward (a freed
  -- one makes the pool query the copy stream's events, which runs it).
  local Sq = nn.Module:extend('Sq')
  function Sq:forward(x)
    local h = x * 3
    if self.keep then self.h = h end
    return (h * h):sum()
  end
  local function sq_grad(offload, seed, between, keep)
    local m = Sq()
    m.keep = keep
    if offload then fsdp.offload_activations(m, function() return true end) end
    local x0 = fsdp.randn({ 64, 32 }, { seed = seed }):to(DEV):requires_grad_(true)
    local was = fsdp.set_collect_budget(0)
    local y = m(x0)
    collectgarbage()
    collectgarbage() -- the forward's h is freed while its copy may still be queued
    if between then between() end
    y:backward()
    fsdp.set_collect_budget(was)
    return { x = x0.grad:cpu() }
  end

  it('copies back only after the copy to the host ran', function()
    for seed = 1, 2 do -- the second run may get the first one's pinned block
      fsdp.cuda.reset_offload_stats()
      local got = sq_grad(true, seed, nil, true)
      assert.equals(1, fsdp.cuda.offload_stats().copies)
      assert_identical(got, sq_grad(false, seed, nil, true), 'seed ' .. seed)
    end
  end)

  it('does not reuse the device block a queued copy reads', function()
    local want = sq_grad(false, 3)
    local got = sq_grad(true, 3, function()
      -- h's block is free now: a tensor of its size would get it at once
      -- if the pool did not wait for the copy stream
      -- (two: h * h, freed too, has its size)
      local z1 = fsdp.full({ 64, 32 }, 5, { device = DEV })
      local z2 = fsdp.full({ 64, 32 }, 5, { device = DEV })
      assert.equals(10 * 64 * 32, z1:sum():item() + z2:sum():item())
    end)
    assert_identical(got, want, 'device block reused')
  end)

  it('does not reuse a pinned block a queued copy writes when the forward is dropped', function()
    local m = Sq()
    fsdp.offload_activations(m, function() return true end)
    local x0 = fsdp.randn({ 64, 32 }, { seed = 4 }):to(DEV):requires_grad_(true)
    local was = fsdp.set_collect_budget(0)
    fsdp.cuda.reset_offload_stats()
    local y = m(x0)
    assert.equals(1, fsdp.cuda.offload_stats().copies)
    y = nil -- luacheck: ignore (dropped without backward: the entry frees its pinned block)
    collectgarbage()
    collectgarbage()
    local q = fsdp.empty({ 64, 32 }, { pin_memory = true })
    q:fill_(7)
    fsdp.cuda.synchronize() -- whatever copy was still queued runs now
    assert.equals(7 * 64 * 32, q:sum():item(), 'the queued copy wrote into a reused pinned block')
    fsdp.set_collect_budget(was)
  end)

  -- [Note: offload prefetch]. A chain of products: h1 = x0 * 3 and each
  -- h(i+1) = h(i) * h(i) saves h(i); backward unpacks the last one itself
  -- and prefetches the others, which the compute stream must wait for (a
  -- block not yet written holds a freed tensor's values or, fresh, NaNs).
  local Chain = nn.Module:extend('Chain')
  function Chain:forward(x)
    local h = x * 3
    for _ = 1, 4 do h = h * h * 0.5 end -- * 0.5 keeps the values finite
    return h:sum()
  end
  local function chain_grad(offload, seed)
    local m = Chain()
    if offload then fsdp.offload_activations(m, function() return true end) end
    local x0 = fsdp.randn({ 32, 16 }, { seed = seed }):to(DEV):requires_grad_(true)
    local was = fsdp.set_collect_budget(0)
    local y = m(x0)
    collectgarbage()
    collectgarbage()
    y:backward()
    fsdp.set_collect_budget(was)
    return { x = x0.grad:cpu() }
  end

  it('prefetches the copies back, and the compute stream waits for them', function()
    for _, window in ipairs({ false, 1, 0 }) do
      local what = 'FSDP_OFFLOAD_PREFETCH=' .. tostring(window or 'unset')
      fsdp.cuda.reset_offload_stats()
      local got = with_window(window or nil, function() return chain_grad(true, 7) end)
      local st = fsdp.cuda.offload_stats()
      assert_identical(got, chain_grad(false, 7), what)
      assert.equals(4, st.copies, what)
      assert.equals(4, st.restores, what)
      -- all but the last saved, which its node copies back itself; a
      -- window of 1 still reaches each one a node ahead
      assert.equals(window == 0 and 0 or 3, prefetched(), what)
    end
  end)

  it('rejects an FSDP_OFFLOAD_PREFETCH that is not a count', function()
    local m = Chain()
    fsdp.offload_activations(m, function() return true end)
    with_window('many', function()
      raises(function() m(fsdp.ones({ 2 }, { device = DEV })) end,
        "FSDP_OFFLOAD_PREFETCH must be a number of entries (0 or more), got 'many'")
    end)
    assert.equals(0, C.fl_offload_depth())
  end)

  -- Saves three tensors on a branch backward never runs, then one it runs:
  -- that node's unpack prefetches the branch's entries (saved before it),
  -- as many as the window allows; they are dropped with the branch after
  -- backward, their copies still queued on the deferred copy stream (no
  -- later wait forced it).
  local Branch = nn.Module:extend('Branch')
  function Branch:forward(x)
    local dead = {}
    for i = 1, 3 do
      local d = x * (i + 1)
      dead[i] = d * d
    end
    local e = x * 5
    return (e * e):sum(), dead
  end

  it('prefetches a window ahead, and does not reuse a dropped prefetch\'s block before its copy ran', function()
    local function x0_grad(offload)
      local m = Branch()
      if offload then fsdp.offload_activations(m, function() return true end) end
      local x0 = fsdp.randn({ 64, 32 }, { seed = 8 }):to(DEV):requires_grad_(true)
      local y = m(x0)
      y:backward()
      return x0.grad:cpu()
    end
    local want = x0_grad(false)
    for _, window in ipairs({ 0, 2, false }) do
      local what = 'FSDP_OFFLOAD_PREFETCH=' .. tostring(window or 'unset')
      local m = Branch()
      fsdp.offload_activations(m, function() return true end)
      local x0 = fsdp.randn({ 64, 32 }, { seed = 8 }):to(DEV):requires_grad_(true)
      local was = fsdp.set_collect_budget(0)
      fsdp.cuda.reset_offload_stats()
      local y, dead = with_window(window or nil, function() return m(x0) end)
      collectgarbage()
      collectgarbage()
      y:backward()
      assert.equals(4, fsdp.cuda.offload_stats().copies, what)
      assert.equals(window == 0 and 0 or window == 2 and 2 or 3, prefetched(), what)
      assert.equals(0, normalised_error(x0.grad:cpu(), want), what)
      dead = nil -- luacheck: ignore (the branch's nodes and entries are freed)
      collectgarbage()
      collectgarbage()
      -- the prefetched blocks are free now: tensors of their size would get
      -- them at once if the pool did not wait for the copy stream, whose
      -- queued copies then overwrite them
      local zs = {}
      for i = 1, 8 do zs[i] = fsdp.full({ 64, 32 }, 5, { device = DEV }) end
      fsdp.cuda.synchronize()
      for i = 1, 8 do
        assert.equals(5 * 64 * 32, zs[i]:sum():item(), what .. ': a prefetch wrote into a reused block')
      end
      fsdp.set_collect_budget(was)
    end
  end)

  it('composes with activation checkpointing in either order', function()
    local _, plain = train(DEV, 1)
    for _, order in ipairs({ 'checkpoint first', 'offload first' }) do
      fsdp.cuda.reset_offload_stats()
      local _, grads = train(DEV, 1, function(m)
        if order == 'checkpoint first' then
          fsdp.checkpoint(m, is_layer)
          fsdp.offload_activations(m, is_layer)
        else
          fsdp.offload_activations(m, is_layer)
          fsdp.checkpoint(m, is_layer)
        end
      end)
      assert_identical(grads, plain, order)
      local st = fsdp.cuda.offload_stats()
      -- only the checkpoints' inputs moved: one hidden state per layer
      assert.equals(2, st.copies, order)
      assert.equals(2 * B * T * 64 * 4, st.bytes, order)
      assert.equals(2, st.restores, order)
    end
  end)
end)
