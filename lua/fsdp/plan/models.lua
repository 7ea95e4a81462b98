-- fsdp.plan.models: what a model's training step keeps and computes, for
-- the planner (fsdp.plan): the bytes autograd saves in forward, the
-- gradients each step of backward allocates and frees, FLOPs and the
-- inputs, per model family.
--
-- An estimator is found by the model's class name (a planner never loads
-- models/ itself) and gives, for ctx = {B=, T=, S=, N = tokens per rank,
-- s = bytes per activation element (the compute dtype), ps = bytes per
-- parameter-gradient element (the gathered dtype)}:
--   is_block(m)          the repeated layer (default wrap and checkpoint unit)
--   block(m, ctx)        {saved=, input=, steps={...}} for one block
--   stem(ctx), head(ctx) the model before and after its blocks, same form
--                        (head's steps run first in backward, stem's last)
--   inputs(ctx)          bytes of one batch (ids, targets, images)
--   caches(ctx)          bytes the model keeps across steps (rope tables)
--   flops(ctx, n, blocks_n) model FLOPs of one step (forward + backward) and
--                        the forward FLOPs of the blocks (recomputed when
--                        checkpointed)
-- A backward step {a=, w=, f=, t=} allocates `a` bytes of activation
-- gradients and `w` bytes of parameter gradients (kept until the unit is
-- reduced), uses `t` bytes of scratch meanwhile, then frees `f` bytes
-- (saved tensors and gradients it no longer needs). `saved` is what
-- forward keeps for backward; `input` what a checkpointed block keeps
-- instead (its input); fwd_extra / fwd_ckpt_extra the scratch above that
-- while the block's forward runs (intermediates, when they are not kept).
--
-- The Llama numbers follow, op by op, what this project's CPU autograd
-- saves (flash-style attention keeps q, k, v, the output and a f32
-- logsumexp; norms keep their input and a f32 rstd per row; SwiGLU keeps
-- gate and up) and were checked against fsdp.memory_stats: saved bytes
-- exact, peaks to a few bytes (tests/mpi/plan_memory.lua). T5 and DeepViT
-- are built the same way from their forward code (fsdp.plan.families);
-- other models fall back to a generic estimate from their widths.
local M = {}

local steps = require 'fsdp.plan.steps'
local F32, I64 = steps.F32, steps.I64
local is_a, staging, linear_step, family_fn = steps.is_a, steps.staging, steps.linear_step, steps.family_fn
M.is_a = is_a

-- llama --------------------------------------------------------------------------------

local function llama_block_steps(c, ctx)
  local N, s = ctx.N, ctx.s
  local D, Hq, Hkv, Fd, H = c.dim, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.ffn_dim, c.n_heads
  local nd, nf = N * D * s, N * Fd * s
  return {
    -- MLP: down_proj, SwiGLU, up/gate projections, their sum, the norm.
    { a = nf, w = D * Fd * ctx.ps, f = nf, t = staging(ctx, N, Fd, D) }, -- down_proj: d(act); act freed
    { a = 2 * nf, w = 0, f = 3 * nf },                      -- d(gate), d(up); d(act), gate, up freed
    linear_step(N, D, Fd, ctx, nf),                         -- up_proj; d(up) freed
    linear_step(N, D, Fd, ctx, nf + nd),                    -- gate_proj; d(gate) and the other half freed
    { a = nd, w = D * ctx.ps, f = 2 * nd + nd + N * F32 },  -- norm: d(n2), n2, h, rstd freed
    { a = 0, w = 0, f = nd },                               -- residual: summed into one gradient
    -- attention: o_proj, the head transpose, attention, rotary, q/k/v.
    linear_step(N, Hq, D, ctx, N * Hq * s),                 -- o_proj; its input freed
    { a = N * Hq * s, w = 0, f = N * Hq * s },              -- heads back to [B, H, T, hd]
    { a = N * (Hq + 2 * Hkv) * s + N * H * F32, w = 0,      -- dq, dk, dv (+ f32 row sums)
      f = N * (3 * Hq + 2 * Hkv) * s + 2 * N * H * F32 },   -- q, k, v, o, lse, do freed
    { a = N * (Hq + Hkv) * s, w = 0, f = N * (Hq + Hkv) * s }, -- rotary
    linear_step(N, D, Hq, ctx, N * Hq * s),                 -- q_proj
    linear_step(N, D, Hkv, ctx, N * Hkv * s + nd),          -- k_proj (sums into dx)
    linear_step(N, D, Hkv, ctx, N * Hkv * s + nd + nd),     -- v_proj; n1 freed
    { a = nd, w = D * ctx.ps, f = nd + nd + N * F32 + nd }, -- input norm; x, rstd, residual freed
  }
end

local llama = { name = 'Llama' }

function llama.matches(model)
  return is_a(model, 'LlamaForCausalLM') and type(model.config) == 'table'
end

function llama.is_block(m) return is_a(m, 'LlamaDecoderLayer') end

function llama.block(c, _, ctx)
  local N, s = ctx.N, ctx.s
  local D, Hq, Hkv, Fd, H = c.dim, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.ffn_dim, c.n_heads
  local st = staging(ctx, N, Fd, D)
  return {
    saved = N * s * (4 * D + 3 * Hq + 2 * Hkv + 3 * Fd) + N * F32 * (H + 2),
    input = N * D * s,
    fwd_extra = st,                      -- the widest products' staging
    fwd_ckpt_extra = 3 * N * Fd * s + st, -- not kept: gate, up and their product live at once
    steps = llama_block_steps(c, ctx),
  }
end

function llama.stem(c, ctx)
  -- The embedding keeps only the ids (an input); its backward scatters
  -- into a [V, D] gradient.
  -- Tied to lm_head (Llama 3.2): the gradient exists already; the
  -- embedding's is added into it.
  local vd = c.vocab_size * c.dim * ctx.ps
  return { saved = 0, input = 0, steps = { { a = 0, w = c.tied and 0 or vd, t = c.tied and vd or 0,
                                             f = ctx.N * c.dim * ctx.s } } }
end

function llama.head(c, ctx)
  local N, s, D, V = ctx.N, ctx.s, c.dim, c.vocab_size
  return {
    -- final norm: its input and rstd; lm_head: the normed rows; the loss:
    -- the logits and a f32 logsumexp per row.
    saved = N * (D * s + F32) + N * D * s + N * V * s + N * F32,
    fwd_extra = staging(ctx, N, V, D),
    steps = {
      { a = N * V * s, w = 0, f = N * V * s + N * F32 },           -- d(logits); logits, lse freed
      { a = N * D * s, w = V * D * ctx.ps, f = N * V * s + N * D * s,    -- lm_head; d(logits), normed freed
        t = staging(ctx, N, D, V) },
      { a = N * D * s, w = D * ctx.ps, f = 2 * N * D * s + N * F32 },  -- final norm; d(normed), h, rstd freed
    },
  }
end

function llama.inputs(_, ctx) return 2 * ctx.N * I64 end

-- cos and sin tables [T, head_dim] in the compute dtype, cached by the model.
function llama.caches(c, ctx) return 2 * ctx.T * c.head_dim * ctx.s end

-- PaLM's 6N + 12 L H hd T per token (models/llama.lua's flops_per_token);
-- the blocks' forward is a third of their share.
function llama.flops(c, ctx, n_params, block_params)
  local attn = 12 * c.n_layers * c.n_heads * c.head_dim * ctx.T
  local per_token = family_fn('models.llama', 'flops_per_token')
  local total = per_token and per_token(c, ctx.T, n_params) or 6 * n_params + attn
  return total * ctx.N, (2 * block_params + attn / 3) * ctx.N
end

function llama.tokens(_, ctx) return ctx.N end
function llama.dims(c) return { T = c.max_seq_len } end

-- generic ------------------------------------------------------------------------------

-- Any other model: blocks are the children of its longest ModuleList, the
-- width that of its first Linear's input; a block keeps about 16 width-
-- sized tensors per token (a transformer layer's norm inputs, q/k/v, the
-- attention output, and an MLP four times as wide), its backward about a
-- third more. A rough guide only: give the family an estimator here.
local generic = { name = 'generic' }

function generic.matches() return true end

local function longest_list(model)
  local best, best_n = nil, 1
  for _, nm in ipairs(model:named_modules()) do
    local m = nm[2]
    if is_a(m, 'ModuleList') and #m:children() > best_n then best, best_n = m, #m:children() end
  end
  return best
end

local function width_of(model)
  for _, m in ipairs(model:modules()) do
    local w = rawget(m, '_parameters') and m._parameters.weight
    if is_a(m, 'Linear') and w then return w.shape[2] end
  end
  return 1
end

function generic.setup(model)
  local list = longest_list(model)
  local blocks = {}
  if list then for _, ch in ipairs(list:children()) do blocks[ch] = true end end
  return { width = width_of(model), blocks = blocks }
end

function generic.is_block(m, c) return c.blocks[m] == true end

function generic.block(c, _, ctx)
  local nd = ctx.N * c.width * ctx.s
  return { saved = 16 * nd, input = nd, fwd_extra = 0, fwd_ckpt_extra = 4 * nd,
           steps = { { a = 8 * nd, w = 0, f = 8 * nd + 15 * nd } } }
end

function generic.stem() return { saved = 0, input = 0, steps = {} } end
function generic.head(c, ctx) return { saved = ctx.N * c.width * ctx.s, fwd_extra = 0, steps = {} } end
function generic.inputs(_, ctx) return 2 * ctx.N * I64 end
function generic.caches() return 0 end
function generic.flops(_, ctx, n_params, block_params) return 6 * n_params * ctx.N, 2 * block_params * ctx.N end
function generic.tokens(_, ctx) return ctx.N end
function generic.dims() return { T = 1 } end

local families = require 'fsdp.plan.families'
M.estimators = { llama, families.t5, families.deepvit, generic }

-- The estimator for a model and its config: est, cfg.
function M.find(model)
  for _, e in ipairs(M.estimators) do
    if e.matches(model) then
      return e, e.setup and e.setup(model) or model.config
    end
  end
end

return M
