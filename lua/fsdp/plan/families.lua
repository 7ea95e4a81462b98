-- fsdp.plan.families: the planner's profiles of T5 and DeepViT (see
-- fsdp.plan.models for what a profile gives and how its steps read),
-- written from their forward code the way Llama's is: what each op keeps
-- for backward, what each backward step allocates and frees. Checked
-- against fsdp.memory_stats on tiny configs: T5's saved bytes exact and
-- peaks within 2%; DeepViT's peaks within 3%.
local steps = require 'fsdp.plan.steps'
local F32, I64 = steps.F32, steps.I64
local is_a, staging, linear_step, family_fn = steps.is_a, steps.staging, steps.linear_step, steps.family_fn

-- t5 -------------------------------------------------------------------------------------

-- Pieces shared by T5's and DeepViT's blocks, as backward steps: a norm
-- (its input x and f32 stats freed with its output's gradient) and a
-- linear (its input's gradient and its weight's).
local function norm_step(N, d, ctx, stats)
  return { a = N * d * ctx.s, w = 2 * d * ctx.ps, f = 2 * N * d * ctx.s + stats * N * F32 }
end

-- T5 self- or cross-attention sublayer backward (queries N, keys Nk, inner
-- width i): o, the heads' transpose, attention, q/k/v, the norm, the
-- residual sum.
local function t5_attention_steps(steps, N, Nk, d, i, H, ctx, cross)
  local s = ctx.s
  steps[#steps + 1] = linear_step(N, i, d, ctx, N * i * s)
  steps[#steps + 1] = { a = N * i * s, w = 0, f = N * i * s }
  steps[#steps + 1] = { a = N * i * s + 2 * Nk * i * s + N * H * F32, w = 0,
                        f = 2 * N * i * s + 2 * Nk * i * s + 2 * N * H * F32 + N * i * s }
  steps[#steps + 1] = linear_step(N, d, i, ctx, N * i * s)
  steps[#steps + 1] = linear_step(Nk, d, i, ctx, Nk * i * s + (cross and 0 or N * d * s))
  steps[#steps + 1] = linear_step(Nk, d, i, ctx, Nk * i * s + (cross and Nk * d * s or N * d * s))
  -- cross-attention: k and v's input gradients join the encoder output's
  -- (allocated with the head's steps, freed with the stem's)
  if cross then steps[#steps].f = steps[#steps].f + Nk * d * s end
  steps[#steps + 1] = { a = N * d * s, w = d * ctx.ps, f = 3 * N * d * s + N * F32 } -- d(normed), normed, x
  steps[#steps + 1] = { a = 0, w = 0, f = N * d * s }                            -- residual sum
end

local t5 = { name = 'T5' }
function t5.matches(model) return is_a(model, 'T5ForConditionalGeneration') and type(model.config) == 'table' end
function t5.is_block(m) return is_a(m, 'T5Block') end

function t5.block(c, m, ctx)
  local N, s, d, i, H, Fd = ctx.N, ctx.s, c.d_model, c.num_heads * c.d_kv, c.num_heads, c.d_ff
  local Ne = ctx.N -- encoder and decoder sequences have the same length here
  local dec = rawget(m, 'is_decoder') and true or false
  -- gated: both projections, gelu(g) and the product; relu keeps only its
  -- output (wo's input too)
  local ff_saved = (c.gated and 4 or 1) * N * Fd * s
  -- self-attention: x, normed, q, k, v, output, o's input; residual h;
  -- FF: normed, the MLP's intermediates.
  local saved = N * s * (2 * d + 5 * i) + N * F32 * (1 + H) + N * d * s + N * d * s + N * F32 + ff_saved
  if dec then saved = saved + N * s * (d + 3 * i) + 2 * Ne * i * s + N * d * s + N * F32 * (1 + H) end
  local steps = {}
  -- FF: wo, the activation (and gate), wi, the norm, the residual sum.
  local nf = N * Fd * s
  local nd = N * d * s
  steps[#steps + 1] = linear_step(N, Fd, d, ctx, nf)               -- wo; its input freed
  if c.gated then
    steps[#steps + 1] = { a = 2 * nf, w = 0, f = 3 * nf }            -- gelu(g) * u
    steps[#steps + 1] = { a = nf, w = 0, f = 2 * nf }                -- gelu
    steps[#steps + 1] = linear_step(N, d, Fd, ctx, nf)               -- wi_1
    steps[#steps + 1] = linear_step(N, d, Fd, ctx, nf + 2 * nd)      -- wi_0; the sum, normed freed
  else
    steps[#steps].f = 0                                              -- relu still needs its output
    steps[#steps + 1] = { a = nf, w = 0, f = 2 * nf }                -- relu; its output freed
    steps[#steps + 1] = linear_step(N, d, Fd, ctx, nf + nd)          -- wi; normed freed
  end
  steps[#steps + 1] = { a = nd, w = d * ctx.ps, f = 2 * nd + N * F32 } -- norm: d(normed), h
  steps[#steps + 1] = { a = 0, w = 0, f = nd }                       -- residual sum
  if dec then t5_attention_steps(steps, N, Ne, d, i, H, ctx, true) end
  t5_attention_steps(steps, N, N, d, i, H, ctx, false)
  return { saved = saved, input = N * d * s, fwd_extra = staging(ctx, N, Fd, d),
           fwd_ckpt_extra = ff_saved + staging(ctx, N, Fd, d), steps = steps }
end

function t5.stem(c, ctx)
  local N, s, d, H, T = ctx.N, ctx.s, c.d_model, c.num_heads, ctx.T
  -- The position bias of each stack [T, T, H]; the encoder's final norm
  -- (its input and output, which every decoder block's cross-attention
  -- keeps); the shared embedding's [V, d] gradient.
  local bias = 2 * T * T * H * s
  return { saved = bias + N * (d * s + F32) + N * d * s, input = 0,
           steps = { { a = 0, w = (c.tied and 0 or c.vocab_size * d * ctx.ps) + 2 * c.relative_attention_num_buckets * H * ctx.ps,
                       t = c.tied and c.vocab_size * d * ctx.ps or 0,
                       f = bias + 2 * N * d * s + N * F32 + 2 * N * d * s } } }
end

-- The decoder's final norm (its input and rstd), lm_head's input (the
-- normed rows, or with tied embeddings those rows scaled by d^-0.5: the
-- scaling keeps nothing), the logits and the loss's logsumexp. lm_head's
-- weight gradient is the shared embedding's when tied (the embeddings'
-- backward then adds into it).
function t5.head(c, ctx)
  local N, s, d, V = ctx.N, ctx.s, c.d_model, c.vocab_size
  local nd = N * d * s
  local steps = {
    { a = N * V * s, w = 0, f = N * V * s + N * F32 },                   -- d(logits)
    { a = nd, w = V * d * ctx.ps, f = N * V * s + nd, t = staging(ctx, N, d, V) }, -- lm_head
  }
  if c.scale_decoder_outputs then steps[#steps + 1] = { a = nd, w = 0, f = nd } end -- the scaling
  -- the final norm; the encoder output's gradient starts here (the
  -- decoder's cross-attentions add into it)
  steps[#steps + 1] = { a = nd + nd, w = d * ctx.ps, f = 2 * nd + N * F32 }
  return { saved = N * (d * s + F32) + nd + N * V * s + N * F32, fwd_extra = staging(ctx, N, V, d),
           steps = steps }
end

function t5.inputs(_, ctx) return 2 * ctx.N * I64 + ctx.N * I64 end -- ids, labels, shifted labels
function t5.caches(c, ctx) return 2 * ctx.T * ctx.T * I64 end     -- bucket ids of both stacks
function t5.flops(c, ctx, n_params, block_params)
  -- 6N per token of each side (an encoder token meets the encoder's
  -- parameters, a decoder token the decoder's and the head; 6N per
  -- target token overall, as in the T5 recipe) plus attention.
  local i = c.num_heads * c.d_kv
  local attn = 12 * (c.num_layers + 2 * c.num_decoder_layers) * i * ctx.T
  return (6 * n_params + attn) * ctx.N, (2 * block_params + attn / 3) * ctx.N
end
function t5.tokens(_, ctx) return ctx.N end
function t5.dims() return { T = 512 } end

-- deepvit -------------------------------------------------------------------------------

local deepvit = { name = 'DeepViT' }
function deepvit.matches(model) return is_a(model, 'DeepViT') and type(model.config) == 'table' end
function deepvit.is_block(m) return is_a(m, 'DeepViTBlock') end

-- Tokens per image: the patches and the class token; seq is ignored.
local function vit_tokens(c, ctx) return ctx.B * (c.num_patches + 1) end

function deepvit.block(c, _, ctx)
  local s, d, H, Dh, Fd = ctx.s, c.dim, c.heads, c.dim_head, c.mlp_dim
  local n = c.num_patches + 1
  local N, i = ctx.B * n, H * Dh
  local att = ctx.B * H * n * n * s
  local drop = c.dropout > 0 and 1 or 0
  -- attention: x, stats, normed, qkv, scores, softmax (and dropout), the
  -- head-mixed scores and their norm (+ stats), o's input, residual;
  -- FF: stats, normed, fc1 out, gelu out (and dropout).
  local saved = N * d * s + 2 * N * F32 + N * d * s + 3 * N * i * s + (3 + drop) * att
                + ctx.B * n * n * 2 * F32 + N * i * s + N * d * s
                + 2 * N * F32 + N * d * s + (2 + drop) * N * Fd * s
  local nd, ni = N * d * s, N * i * s
  local steps = {
    linear_step(N, Fd, d, ctx, N * Fd * s),                               -- fc2
    { a = N * Fd * s, w = 0, f = (2 + drop) * N * Fd * s },               -- gelu (dropout)
    linear_step(N, d, Fd, ctx, N * Fd * s + nd),                          -- fc1; normed freed
    norm_step(N, d, ctx, 2),
    { a = 0, w = 0, f = nd },                                             -- residual sum
    linear_step(N, i, d, ctx, ni),                                        -- to_out; its input freed
    { a = ni + att + ni, w = 0, f = 2 * ni + att },                       -- heads back; attn' v: d(attn'), d(v)
    { a = att, w = 2 * H * ctx.ps, f = att + att + ctx.B * n * n * 2 * F32 }, -- the head norm
    { a = att, w = H * H * ctx.ps, f = att },                             -- head mixing
    { a = att, w = 0, f = att + (1 + drop) * att },                       -- softmax (dropout)
    { a = att, w = 0, f = att },                                          -- the scale
    { a = 5 * ni, w = 0, f = att + 3 * ni },                              -- q k^T; d(q), d(k), d(v) join d(qkv)
    linear_step(N, d, 3 * i, ctx, 6 * ni + nd),                           -- to_qkv; d(qkv), qkv, normed freed
    norm_step(N, d, ctx, 2),
    { a = 0, w = 0, f = nd },                                             -- residual sum
  }
  return { saved = saved, input = N * d * s, fwd_extra = 0, fwd_ckpt_extra = 3 * att, steps = steps }
end

function deepvit.stem(c, ctx)
  local N, s, d = vit_tokens(c, ctx), ctx.s, c.dim
  -- the patches' embedding keeps them (a copy of the images, rearranged:
  -- the size of the input batch, measured as such)
  local patches = ctx.B * c.num_patches * c.patch_dim * s
  return { saved = patches, input = 0,
           steps = { { a = 0, w = (c.patch_dim * d + d + (c.num_patches + 2) * d) * ctx.ps,
                       f = patches + N * d * s } } }
end

function deepvit.head(c, ctx)
  local s, d, K, B = ctx.s, c.dim, c.num_classes, ctx.B
  local N = vit_tokens(c, ctx)
  return {
    -- the last block's output (the class token is a view of it), the
    -- norm's stats, the head's input, the logits, the loss's logsumexp
    saved = N * d * s + 2 * B * F32 + B * d * s + B * K * s + B * F32,
    fwd_extra = 0,
    steps = {
      { a = B * K * s, w = 0, f = B * K * s + B * F32 },
      { a = B * d * s, w = K * d * ctx.ps + K * ctx.ps, f = B * K * s + B * d * s },
      { a = B * d * s + N * d * s, w = 2 * d * ctx.ps, f = 2 * B * d * s + 2 * B * F32 + N * d * s },
    },
  }
end

function deepvit.inputs(c, ctx)
  return ctx.B * c.channels * c.image_size * c.image_size * F32 + ctx.B * I64
end
function deepvit.caches() return 0 end
function deepvit.flops(c, ctx, n_params, block_params)
  local f = family_fn('models.deepvit', 'flops_per_image')
  local per_image = f and f(c) or 6 * n_params * (c.num_patches + 1)
  return per_image * ctx.B, per_image * ctx.B * block_params / math.max(n_params, 1) / 3
end
function deepvit.tokens(c, ctx) return vit_tokens(c, ctx) end
function deepvit.dims() return { T = 1 } end

return { t5 = t5, deepvit = deepvit }
