-- tests/mpi/cuda_collectives.lua: collectives on cuda tensors (through
-- NCCL, or through host copies: [Note: collectives on device tensors]) and
-- data-parallel and sharded training on a cuda device against one process
-- on the CPU. Every rank uses cuda:0 (in cudasim each process has its own
-- simulated device; on one real GPU NCCL refuses the ranks and host copies
-- are used), or with FSDP_TEST_CUDA_DEVICE=local cuda:<local rank> (one GPU
-- per rank on a real machine: NCCL for real; in cudasim, with
-- FSDP_CUDASIM_DEVICES set, device indices other than 0). Run by the
-- cudasim suite (tests/cudasim/run.sh) under mpirun -np 2 and -np 4; on a
-- machine with GPUs it runs as it is.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local T = require 'tests.mpi.tap'
local r, W = T.rank, T.world
local DEV = os.getenv('FSDP_TEST_CUDA_DEVICE') == 'local' and 'cuda:' .. dist.local_rank() or 'cuda:0'

T.test('all_gather and broadcast of cuda tensors stay on cuda, values in rank order', function()
  for _, dtype in ipairs { 'f32', 'bf16', 'i64' } do
    local x = fsdp.arange(5, { dtype = dtype }):add(10 * r):to(DEV) -- exact in bf16
    local out = dist.all_gather(x)
    T.truthy(out.device == DEV, 'all_gather result on ' .. out.device)
    local want = {}
    for k = 0, W - 1 do for i = 0, 4 do want[#want + 1] = 10 * k + i end end
    T.eq(out, want, 'all_gather ' .. dtype)
    local b = fsdp.full({ 4 }, r + 1, { dtype = dtype }):to(DEV)
    dist.broadcast(b, W - 1)
    T.truthy(b.device == DEV, 'broadcast stays on ' .. DEV)
    T.eq(b, { W, W, W, W }, 'broadcast ' .. dtype)
  end
end)

T.test('all_reduce and reduce_scatter of cuda tensors: sum, avg, max; f32 and bf16', function()
  local n = 3 * W
  for _, dtype in ipairs { 'f32', 'bf16' } do
    local x = fsdp.arange(n, { dtype = dtype }):add(r):to(DEV)
    dist.all_reduce(x, { op = 'sum' })
    local want = {}
    for i = 0, n - 1 do want[i + 1] = W * i + W * (W - 1) / 2 end
    T.eq(x, want, 'all_reduce sum ' .. dtype)

    local y = fsdp.full({ n }, r, { dtype = dtype }):to(DEV)
    dist.all_reduce(y, { op = 'max' })
    T.eq(y, fsdp.full({ n }, W - 1), 'all_reduce max ' .. dtype)

    local z = fsdp.arange(n, { dtype = dtype }):mul(r + 1):to(DEV)
    local out = fsdp.empty({ 3 }, { dtype = dtype, device = DEV })
    dist.reduce_scatter(z, { op = 'avg', out = out })
    T.truthy(out.device == DEV, 'reduce_scatter result on ' .. out.device)
    local mean = (W + 1) / 2
    want = {}
    for i = 0, 2 do want[i + 1] = (3 * r + i) * mean end
    T.eq(out, want, 'reduce_scatter avg ' .. dtype, dtype == 'bf16' and 0.02 or 1e-6)
  end
end)

T.test('a cuda all_reduce started async reaches the tensor at wait()', function()
  local x = fsdp.full({ 1000 }, r + 1):to(DEV)
  local work = dist.all_reduce(x, { op = 'sum', async = true })
  work:wait()
  T.eq(x, fsdp.full({ 1000 }, W * (W + 1) / 2), 'after wait')
end)

-- The world's first cuda collective decided how it moves them: NCCL when
-- every rank has it and could make a communicator, else host copies.
-- FSDP_EXPECT_DEVICE_LIBRARY (set by tests/cudasim/run.sh) says which.
T.test('the world moved the cuda tensors through the expected library', function()
  local got, want = dist.world():device_library(), os.getenv('FSDP_EXPECT_DEVICE_LIBRARY')
  T.truthy(got == 'nccl' or got == 'host copies', 'device library ' .. got)
  T.truthy(not want or got == want, ('device library %s, expected %s'):format(got, tostring(want)))
end)

-- [Note: destroying device communicators]: a group's NCCL communicator is
-- destroyed at finalize in creation order, not when Lua collects the
-- group, which happens at a different moment on every rank (destroying is
-- collective in NCCL: done then it would hang). Here: the groups work and
-- the run ends; the simulated NCCL's destroy does not block, so the hang
-- itself only a real NCCL could show.
T.test('cuda groups released at different moments on each rank are destroyed at the end', function()
  for round = 1, 2 do
    local ranks = {}
    for i = 0, W - 1 do ranks[#ranks + 1] = i end
    local g = dist.new_group(ranks)
    local x = fsdp.full({ 8 }, r + round, { device = DEV })
    dist.all_reduce(x, { group = g })
    T.eq(x, fsdp.full({ 8 }, W * (W - 1) / 2 + W * round), 'group round ' .. round)
    g = nil
    if r % 2 == round % 2 then collectgarbage() collectgarbage() end
    dist.barrier()
  end
end)

T.test('a cpu output with a cuda input is refused, naming both devices', function()
  local ok, err = pcall(dist.reduce_scatter, fsdp.zeros({ 2 * W }):to(DEV), { out = fsdp.empty({ 2 }) })
  T.truthy(not ok and tostring(err):find('cpu', 1, true) and tostring(err):find(DEV, 1, true),
    tostring(err))
end)

-- `steps` AdamW steps of ref (one process, the whole batch, on the CPU) and
-- m (this rank's B rows on cuda:0; sync(m) after backward makes the ranks'
-- gradients agree, unless m is sharded), checking the ranks' mean loss
-- against ref's each step within tol.
local function train_against(ref, m, ids, targets, B, steps, tol, sync)
  local ref_opt = optim.AdamW(ref:named_parameters(), { lr = 1e-2 })
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-2 })
  local my_ids = ids:narrow(0, r * B, B):contiguous():to(DEV)
  local my_targets = targets:narrow(0, r * B, B):contiguous():to(DEV)
  for step = 1, steps do
    local want = ref:loss(ids, targets)
    want:backward()
    ref_opt:step(); ref_opt:zero_grad()
    local loss = m:loss(my_ids, my_targets)
    loss:backward()
    if sync then sync(m) end
    opt:step(); opt:zero_grad()
    local global = loss:detach():clone()
    dist.all_reduce(global, { op = 'avg' })
    local e = math.abs(global:item() - want:item()) / want:item()
    T.truthy(e < tol, ('step %d: loss %.8g on %d ranks on cuda, %.8g on one cpu process (relative %.2g)')
      :format(step, global:item(), W, want:item(), e))
  end
end

T.test('data-parallel training on ' .. DEV .. ' matches one process on the CPU', function()
  local VOCAB, B, SEQ = 128, 2, 32
  local c = llama.config('tiny', { n_layers = 2, vocab_size = VOCAB })
  local function build(device)
    local m = llama.build(c, { device = device })
    m:init_weights({ seed = 7 })
    return m
  end
  local ids = fsdp.randint(0, VOCAB, { B * W, SEQ }, { seed = 1 })
  local targets = fsdp.randint(0, VOCAB, { B * W, SEQ }, { seed = 2 })

  train_against(build('cpu'), build(DEV), ids, targets, B, 4, 1e-5, function(m)
    for _, p in ipairs(m:parameters()) do dist.all_reduce(p.grad, { op = 'avg' }) end
  end)
end)

-- FULL_SHARD on cuda:0: the units' gathered buffers live in reserved
-- device address ranges (cuda_vm.cu; simulated by mmap in cudasim), every
-- all-gather and reduce-scatter moves cuda tensors. Against one process on
-- the CPU training the whole batch.
local CASES = {
  { strategy = 'FULL_SHARD', tol = 1e-5 },
  { strategy = 'SHARD_GRAD_OP', tol = 1e-5 },
  { strategy = 'NO_SHARD', tol = 1e-5 },
  { strategy = 'FULL_SHARD', tol = 2e-2, -- bf16: see fsdp_equivalence.lua's bounds
    mixed_precision = { param = 'bf16', reduce = 'f32', buffer = 'bf16' } },
  { strategy = 'FULL_SHARD', tol = 1e-5, cpu_offload = true },
  { strategy = 'NO_SHARD', tol = 1e-5, cpu_offload = true },
  { strategy = 'FULL_SHARD', tol = 2e-2, cpu_offload = true,
    mixed_precision = { param = 'bf16', reduce = 'f32', buffer = 'bf16' } },
}
for _, case in ipairs(CASES) do
T.test(('%s%s%s training on %s matches one process on the CPU'):format(case.strategy,
  case.mixed_precision and ' bf16' or '', case.cpu_offload and ' with cpu_offload' or '', DEV), function()
  local VOCAB, B, SEQ = 64, 2, 16
  local c = llama.config('tiny', { n_layers = 2, dim = 32, n_heads = 4, n_kv_heads = 2, ffn_dim = 64,
                                   vocab_size = VOCAB })
  local ids = fsdp.randint(0, VOCAB, { B * W, SEQ }, { seed = 3 })
  local targets = fsdp.randint(0, VOCAB, { B * W, SEQ }, { seed = 4 })
  local one = dist.split(r, { name = 'one rank' })
  local function build(device, group)
    local m = llama.CausalLM(c, { device = 'meta' })
    fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 5,
                    device = device, group = group, strategy = case.strategy,
                    mixed_precision = case.mixed_precision,
                    cpu_offload = device ~= 'cpu' and case.cpu_offload })
    return m
  end
  local m = build(DEV)
  train_against(build('cpu', one), m, ids, targets, B, 3, case.tol)
  -- offloaded: every parameter the optimizer steps (the shards) is on the host
  local where = m:parameters()[1].device
  T.truthy(where == (case.cpu_offload and 'cpu' or DEV), 'shards on ' .. where)
end)
end

T.done()
