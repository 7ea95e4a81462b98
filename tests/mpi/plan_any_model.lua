-- tests/mpi/plan_any_model.lua: fsdp.plan on a model nobody taught it.
--
-- The model below exists only in this file: a patch embedding, residual
-- MLP blocks with a LayerNorm and GELU, a pooled classification head and
-- its own loss and example batch, built from fsdp.nn. The planner has no
-- code for it: it traces its step (fsdp.plan.trace). Every rank plans it
-- for its own rank, then shards the same model, trains two steps (loss,
-- backward, AdamW) and measures persistent and peak bytes as
-- tests/mpi/plan_memory.lua does; both must be within 15% of the plan.
-- The blocks are found as the children of its ModuleList.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local F = require 'fsdp.functional'
local dist = fsdp.dist
local optim = require 'fsdp.optim'
local T = require 'tests.mpi.tap'

fsdp.set_collect_budget(0)
local R, W = T.rank, T.world
local B, SEQ, IN, D, H, CLASSES = 3, 24, 20, 48, 112, 7
local TOLERANCE = 0.15

local Block = nn.Module:extend('TestResidualMLP')
function Block:__init(o)
  self.norm = nn.LayerNorm(D, o)
  self.up = nn.Linear(D, H, o)
  self.down = nn.Linear(H, D, o)
end
function Block:forward(x) return x + self.down(F.gelu(self.up(self.norm(x)))) end

local Net = nn.Module:extend('TestPatchClassifier')
function Net:__init(o)
  self.embed = nn.Linear(IN, D, o)
  self.blocks = nn.ModuleList()
  for _ = 1, 4 do self.blocks:append(Block(o)) end
  self.norm = nn.LayerNorm(D, o)
  self.head = nn.Linear(D, CLASSES, o)
end
function Net:forward(x)
  local h = self.embed(x)
  for _, b in ipairs(self.blocks:children()) do h = b(h) end
  return self.head(F.mean(self.norm(h), 1))
end
function Net:loss(x, y) return F.cross_entropy(self(x), y), nil end
function Net:example_batch(batch, seq)
  seq = seq or SEQ
  return { n = 2, fsdp.empty({ batch, seq, IN }, { device = 'meta' }),
           fsdp.empty({ batch }, { dtype = 'i64', device = 'meta' }) }, batch * seq, seq
end

local function in_use()
  fsdp.collect() -- [Note: traces pin closures]
  return fsdp.memory_stats('cpu').in_use
end

local function measure(strategy, mp, checkpoint)
  dist.barrier()
  local base = in_use()
  local m = Net({ device = 'meta' })
  fsdp.shard(m, { policy = fsdp.policy.transformer { Block }, seed = 1, strategy = strategy, mixed_precision = mp })
  if checkpoint then fsdp.checkpoint(m, function(x) return x:is_instance_of(Block) end) end
  local opt = optim.AdamW(m:parameters(), { lr = 1e-3 })
  local peak
  for step = 1, 2 do
    if step == 2 then fsdp.reset_memory_stats('cpu') end
    local x = fsdp.randn({ B, SEQ, IN }, { seed = 10 * R + step })
    local y = fsdp.randint(0, CLASSES, { B }, { seed = 100 + 10 * R + step })
    local loss = m:loss(x, y)
    loss:backward()
    loss, x, y = nil, nil, nil
    opt:step()
    opt:zero_grad()
    if step == 2 then peak = fsdp.memory_stats('cpu').peak - base end
  end
  return in_use() - base, peak
end

local cases = {
  { 'FULL_SHARD', nil, false }, { 'SHARD_GRAD_OP', 'bf16', true }, { 'NO_SHARD', nil, false },
  { 'FULL_SHARD', 'bf16', true },
}
for _, case in ipairs(cases) do
  local strategy, mp, checkpoint = case[1], case[2], case[3]
  local label = ('%s %s%s on %d ranks'):format(strategy, mp or 'f32', checkpoint and ' checkpointed' or '', W)
  T.test('a model defined only here is planned within 15%: ' .. label, function()
    local plan = fsdp.plan(Net({ device = 'meta' }), { world = W, rank = R, strategy = strategy,
      mixed_precision = mp, checkpoint = checkpoint, batch = B, seq = SEQ, device = 'cpu' })
    T.truthy(plan.blocks == 4, ('4 blocks found, got %d'):format(plan.blocks))
    local persistent, peak = measure(strategy, mp, checkpoint)
    local pm = plan.memory
    local dp, dk = pm.persistent / persistent - 1, pm.peak / peak - 1
    if R == 0 then
      io.stdout:write(('# %s: persistent %d planned %d (%+.2f%%), peak %d planned %d (%+.2f%%)\n'):format(
        label, persistent, pm.persistent, 100 * dp, peak, pm.peak, 100 * dk))
    end
    T.truthy(math.abs(dp) <= TOLERANCE, ('rank %d: persistent %d bytes, planned %d'):format(R, persistent, pm.persistent))
    T.truthy(math.abs(dk) <= TOLERANCE, ('rank %d: peak %d bytes, planned %d (at %s)'):format(R, peak, pm.peak, pm.peak_at))
  end)
end

T.done()
