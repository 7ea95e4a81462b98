-- benchmarks/fsdp_step.lua: time of a sharded training step per strategy
-- and prefetch mode, and how much of the communication hides behind
-- compute. Prints numbers; asserts nothing (compare ratios within a run).
--
--   mpirun -np 2 fsdp-lua benchmarks/fsdp_step.lua [--steps=5] [--layers=4] [--dim=256]
--
-- For each configuration: milliseconds per step (best of --steps after a
-- warmup step that records the orders prefetching follows), and the bytes
-- one rank sends and receives per step in all-gathers and reduce-scatters
-- (analytic: 2 gathers (FULL_SHARD) or 1 per unit, one reduce-scatter).
-- "one rank" is the same global batch on a single rank without any
-- communication: the ideal a sharded step approaches when communication is
-- hidden and compute splits perfectly. "comm ms" is the time rank 0's
-- collectives were in flight in that step (fsdp.dist.collective_stats'
-- busy time), "exposed ms" the time it blocked waiting for them (what
-- compute did not hide), also as a share of the step.
local fsdp = require 'fsdp'
local dist = fsdp.dist
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local options = require 'fsdp.options'
local clock = require 'fsdp.clock'

local cfg = options.config({
  steps = { 5, 'measured steps per configuration' },
  layers = { 4, 'decoder layers' },
  dim = { 256, 'model width' },
  batch = { 2, 'sequences per rank' },
  seq = { 128, 'tokens per sequence' },
}, arg, 'benchmarks/fsdp_step.lua')

local R, W = dist.rank(), dist.world_size()
local C = { dim = cfg.dim, n_layers = cfg.layers, n_heads = 8, n_kv_heads = 8,
            ffn_dim = math.ceil(cfg.dim * 8 / 3 / 32) * 32, vocab_size = 4096, max_seq_len = cfg.seq }
local G = cfg.batch * W
local ids = fsdp.randint(0, C.vocab_size, { G, cfg.seq }, { seed = 1 })
local policy = fsdp.policy.transformer { llama.DecoderLayer }

local function run(opts, rows, first)
  local m = llama.CausalLM(llama.config('Llama-2-7b', C), { device = 'meta' })
  opts.policy = policy
  fsdp.shard(m, opts)
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-4 })
  local x = ids:narrow(0, first, rows)
  local best, comm, exposed = math.huge, 0, 0
  for s = 0, cfg.steps do
    dist.barrier()
    local before = dist.collective_stats().any
    local t0 = clock.now()
    local loss = m:loss(x, x)
    loss:backward()
    opt:step(); opt:zero_grad()
    local t = clock.now() - t0
    local after = dist.collective_stats().any
    dist.barrier()
    if s > 0 and t < best then
      best, comm, exposed = t, after.busy_s - before.busy_s, after.wait_s - before.wait_s
    end
  end
  return best * 1e3, m, comm * 1e3, exposed * 1e3
end

local function say(...) if R == 0 then print(string.format(...)) end end

local one = dist.split(R, { name = 'one rank' })
local base, m = run({ group = one }, G, 0)
local n = m:num_parameters()
say('Llama %d layers width %d: %.2fM parameters, global batch %d x %d, %d ranks',
  cfg.layers, cfg.dim, n / 1e6, G, cfg.seq, W)
say('%-22s %-8s %10s %12s %10s %12s', 'strategy', 'prefetch', 'ms/step', 'vs one rank', 'comm ms', 'exposed ms')
say('%-22s %-8s %10.1f %12s %10s %12s', 'one rank (no comm)', '-', base, '1.00', '-', '-')
local modes = {
  { 'none', { backward_prefetch = false } },
  { 'pre', { backward_prefetch = 'pre' } },
  { 'post', { backward_prefetch = 'post' } },
  { 'fwd+pre', { backward_prefetch = 'pre', forward_prefetch = true, limit_all_gathers = true } },
}
for _, strategy in ipairs({ 'FULL_SHARD', 'SHARD_GRAD_OP', 'NO_SHARD' }) do
  for _, mode in ipairs(modes) do
    local opts = { strategy = strategy }
    for k, v in pairs(mode[2]) do opts[k] = v end
    local ms, _, comm, exposed = run(opts, cfg.batch, R * cfg.batch)
    say('%-22s %-8s %10.1f %12.2f %10.1f %7.1f (%2.0f%%)', strategy, mode[1], ms, ms / base, comm, exposed,
      100 * exposed / ms)
  end
end
local gathers = 2 * n * 4 * (W - 1) / W
say('per step and rank, FULL_SHARD: all-gathers move %.1f MB, reduce-scatters %.1f MB', gathers / 1e6,
  gathers / 2 / 1e6)
