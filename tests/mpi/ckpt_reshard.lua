-- tests/mpi/ckpt_reshard.lua: a sharded checkpoint saved on N ranks with
-- one strategy and wrap loads on M ranks with another (resharding by
-- parameter names and offsets), with identical whole parameters at the
-- resume point, and training continues as it would have.
--
--   mpirun -np 4 fsdp-lua tests/mpi/ckpt_reshard.lua save WORK FULL_SHARD transformer
--   mpirun -np 2 fsdp-lua tests/mpi/ckpt_reshard.lua load WORK NO_SHARD transformer [FROM [TO]]
--
-- save: trains K steps, saves WORK/<TO or a> at step K, writes the whole
-- parameters at step K (WORK/ref.safetensors, streamed) and the losses of
-- K more steps (WORK/ref_losses.txt). load: builds the model with this
-- run's strategy and wrap, loads WORK/<FROM or a>, checks every whole
-- parameter bit for bit against ref.safetensors, optionally saves again at
-- step K into WORK/<TO> (so the next run loads what this layout wrote),
-- then trains K more steps and checks the losses against the reference,
-- and saves once more: every parameter's optimizer step must then be 2K;
-- with several ranks, a save where one rank's steps differ must fail on
-- every rank, naming the parameter.
-- The data are one fixed global batch per step, split over the ranks, so
-- any world size sees the same global batches; losses may then differ
-- only in the order of additions (f32: 1e-5 relative, as
-- tests/mpi/fsdp_equivalence.lua).
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local ckpt = require 'fsdp.checkpointing'
local T = require 'tests.mpi.tap'

local mode, work, strategy, wrap, from, to = arg[1], arg[2], arg[3], arg[4], arg[5] or 'a', arg[6]
-- Without its arguments it would write into ./nil/ (it once did, and the
-- files were committed): refused instead.
if (mode ~= 'save' and mode ~= 'load') or not work or not strategy or not wrap then
  io.stderr:write('usage: ckpt_reshard.lua save|load WORK STRATEGY WRAP [FROM [TO]]\n')
  os.exit(2)
end
if mode == 'save' then to = to or 'a' end
local R, W = T.rank, T.world
local K, G, SEQ = 3, 4, 16
local CFG = { dim = 32, n_layers = 3, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }

local ids = fsdp.randint(0, CFG.vocab_size, { 2 * K * G, SEQ }, { seed = 11 })
local tgs = fsdp.randint(0, CFG.vocab_size, { 2 * K * G, SEQ }, { seed = 12 })

-- Step s (1-based) reads global rows [(s-1)G, sG); rank r its G/W of them.
-- The position is checkpointed like a real data source's.
local Data = {}
Data.__index = Data
function Data:next()
  self.step = self.step + 1
  local rows = G / W
  local first = (self.step - 1) * G + R * rows
  return ids:narrow(0, first, rows), tgs:narrow(0, first, rows)
end
function Data:state() return { step = self.step } end
function Data:load_state(s) self.step = s.step end

local policies = { transformer = fsdp.policy.transformer { llama.DecoderLayer }, none = fsdp.policy.none }

local function build()
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  fsdp.shard(m, { policy = policies[wrap], strategy = strategy, seed = 7 })
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-2, weight_decay = 0.1,
    groups = { { match = function(_, p) return #(rawget(p, 'fsdp_shape') or p.shape) < 2 end, weight_decay = 0 } } })
  local sched = optim.lr_scheduler.WarmupCosine(opt, { warmup_steps = 2, total_steps = 2 * K, min_lr = 1e-3 })
  return m, opt, sched, setmetatable({ step = 0 }, Data)
end

local function train_step(m, opt, sched, data)
  local x, y = data:next()
  local loss = m:loss(x, y)
  loss:backward()
  fsdp.clip_grad_norm(m, 1.0)
  opt:step()
  sched:step()
  opt:zero_grad()
  local l = fsdp.tensor({ loss:item() }, { dtype = 'f64' })
  dist.all_reduce(l, { op = 'avg' })
  return l:item()
end

local m, opt, sched, data = build()
local label = ('%d rank%s, %s, wrap %s'):format(W, W == 1 and '' or 's', strategy, wrap)

if mode == 'save' then
  for _ = 1, K do train_step(m, opt, sched, data) end
  T.test(('save at step %d on %s'):format(K, label), function()
    ckpt.save(work .. '/' .. to, { model = m, optimizer = opt, scheduler = sched, data = data, step = K })
    ckpt.save_full_state_dict(work .. '/ref.safetensors', m)
  end)
  local losses = {}
  for s = 1, K do losses[s] = ('%.17g'):format(train_step(m, opt, sched, data)) end
  if R == 0 then
    local f = assert(io.open(work .. '/ref_losses.txt', 'w'))
    f:write(table.concat(losses, '\n'), '\n')
    f:close()
  end
  T.done()
  return
end

local info
T.test(('load %s (saved on another layout) on %s'):format(from, label), function()
  info = ckpt.load(work .. '/' .. from, { model = m, optimizer = opt, scheduler = sched, data = data })
  T.truthy(info.step == K, ('resumed at step %s, expected %d'):format(tostring(info.step), K))
  T.truthy(data.step == K, 'data position restored')
end)

T.test(('whole parameters at step %d equal the saving run\'s bit for bit (%s)'):format(K, label), function()
  local ref = fsdp.load_safetensors(work .. '/ref.safetensors')
  local got = fsdp.full_state_dict(m)
  local n = 0
  for name, t in pairs(ref) do
    T.truthy(got[name] ~= nil, 'missing ' .. name)
    local diff = (got[name] - t):abs():max():item()
    T.truthy(diff == 0, ('%s differs by %g'):format(name, diff))
    n = n + 1
  end
  T.truthy(n == #m:named_parameters(), ('%d tensors in the reference, %d parameters'):format(n, #m:named_parameters()))
end)

if to then
  T.test(('save again at step %d on %s'):format(K, label), function()
    ckpt.save(work .. '/' .. to, { model = m, optimizer = opt, scheduler = sched, data = data, step = K })
  end)
end

T.test(('training continues with the saving run\'s losses (%s)'):format(label), function()
  local want = {}
  for line in io.lines(work .. '/ref_losses.txt') do want[#want + 1] = tonumber(line) end
  T.truthy(#want == K, 'reference losses')
  local got = {}
  for s = 1, K do got[s] = train_step(m, opt, sched, data) end
  for s = 1, K do
    local rel = math.abs(got[s] - want[s]) / math.abs(want[s])
    T.truthy(rel <= 1e-5, ('step %d: loss %.9g, the saving run %.9g (relative %.2g)'):format(K + s, got[s], want[s], rel))
  end
  if R == 0 then print(('# %s: losses after resume %s'):format(label, table.concat(got, ' '))) end
end)

-- A resumed run's own checkpoint: every parameter's counters are the
-- ranks' that hold it, whichever segments are empty where (a rank's copy
-- of a parameter it holds nothing of used to stay at the resumed step),
-- and no rank keeps state for a parameter it holds nothing of.
T.test(('a save %d steps after the resume holds step %d for every parameter (%s)'):format(K, 2 * K, label), function()
  local dir = ('%s/later-%s-%d-%s'):format(work, from, W, strategy)
  ckpt.save(dir, { model = m, optimizer = opt, scheduler = sched, data = data, step = 2 * K })
  local index = ckpt.directory.read_index(ckpt.latest(dir))
  local n = 0
  for _, np in ipairs(m:named_parameters()) do
    T.truthy(np[2]:numel() > 0 or opt.state[np[1]] == nil,
      ('rank %d holds no element of %s but keeps optimizer state for it'):format(R, np[1]))
    local st = index.optimizer.state[np[1]]
    T.truthy(st and st.step == 2 * K, ('%s: step %s in the index, expected %d'):format(np[1],
      tostring(st and st.step), 2 * K))
    n = n + 1
  end
  T.truthy(n > 0, 'parameters')
end)

-- Ranks that hold pieces of one parameter step it together; if they ever
-- disagree, every rank's save fails (no hang), naming the parameter.
if W > 1 then
  T.test(('ranks that disagree on a parameter\'s step fail the save together (%s)'):format(label), function()
    if R == W - 1 then
      for _, st in pairs(opt.state) do st.step = st.step + 1 end
    end
    local dir = ('%s/disagree-%s-%d-%s'):format(work, from, W, strategy)
    T.raises(function()
      ckpt.save(dir, { model = m, optimizer = opt, scheduler = sched, data = data, step = 2 * K + 1 })
    end, 'checkpointing.save ' .. dir .. '/step-', ('step = %d} on rank %d'):format(2 * K + 1, W - 1),
      'which both hold elements of it')
    T.truthy(not ckpt.latest(dir), 'no complete checkpoint')
  end)
end

T.done()
