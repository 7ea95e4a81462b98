-- fsdp.tp.styles: what each TP style does to a module: its parameters
-- replaced by this rank's shards (same names, p.tp set) and its forward
-- by the parallel one. fsdp.tp (init.lua) checks a whole plan first
-- (check), then applies it (apply), so a bad plan changes nothing.
--
--   colwise          Linear [out, in]: weight and bias split by rows (dim 0); input copied in
--                    (copy_to: all-reduce of its gradient) unless it sits in a region, whose
--                    input is copied in once for all its colwise layers; output this rank's
--                    features
--   rowwise          Linear: weight split by columns (dim 1), input this rank's features;
--                    one all-reduce of the output (reduce_from), then the (replicated) bias
--   vocab_embedding  Embedding [V, D] split by rows; ids outside this rank's rows give 0;
--                    one all-reduce of the output
--   vocab_head       bias-free Linear [V, D] split by rows; with a loss (forward(x, ce)) the
--                    vocab-parallel cross-entropy (fsdp.tp.cross_entropy), else the logits
--                    gathered on the last dim
--   attention        nn.Attention: n_heads and n_kv_heads divided by the TP size (its q/k/v
--                    must be colwise and o rowwise in the same plan); a region
--   region           a module holding colwise and rowwise layers (the MLP)
--   sequence         a module between the regions (the norms): nothing without sequence
--                    parallelism
-- [Note: TP regions] An 'attention' or 'region' module is where a replicated
-- input enters rank-local computation: its colwise layers each produce a
-- partial gradient of that input, and the input's whole gradient is their
-- sum, so the region copies its input in once (copy_to: one all-reduce in
-- backward, summing all of them together) and its colwise layers skip
-- their own (Megatron-LM's layout: per transformer layer two all-reduces in
-- forward, the rowwise outputs, and two in backward, the regions' inputs,
-- where a copy_to per colwise layer made five). Under sequence parallelism
-- the region's all-gather plays the copy_to (its reduce-scatter backward
-- sums). So inside a region its input may feed only colwise layers: a
-- replicated path from the region's input to its output would have its
-- whole gradient summed T times.
-- Regions do not nest (parallelize refuses it). A cross-attention's
-- context (opts.context, the input of k and v) is copied in alike.
-- [Note: sequence parallelism] (tp.parallelize(..., {sequence_parallel = true}); Megatron-LM's
-- SP, Korthikanti et al. 2022) The hidden states between the TP regions are
-- [B, S/T, dim]: this rank's rows of the sequence (dim 1). An attention or
-- region module all-gathers its input along the sequence (gather with a
-- reduce-scatter backward, which also sums the colwise layers' partial input
-- gradients, in place of the region's copy_to: [Note: TP regions]); a
-- rowwise layer reduce-scatters its output along the sequence instead of
-- all-reducing it (backward: all-gather); vocab_embedding reduce-scatters its lookup, vocab_head
-- gathers its input. The 'sequence' modules (norms) run on their rows
-- alone, so the gradient of a replicated parameter used there (a norm's
-- weight, a rowwise bias, the replicated LoRA factor next to a collective)
-- is this rank's rows' part: it is used through copy_to (identity forward,
-- all-reduce of its gradient over the TP group), so every TP rank holds the
-- whole gradient by the end of backward, as without SP. Rotary positions
-- need nothing: attention runs on the gathered sequence with the whole
-- sequence's tables (the model computes them from the ids, which every TP
-- rank holds whole).
-- LoRA (nn.LoRALinear, applied before parallelize): colwise keeps lora_A
-- replicated and splits lora_B by rows, rowwise splits lora_A by columns
-- and keeps lora_B replicated; the low-rank activation is where the
-- collective sits, so replicated adapters get whole, equal gradients.
local core = require 'fsdp.core'
local F = require 'fsdp.functional'
local factories = require 'fsdp.factories'
local parameter = require 'fsdp.nn.parameter'
local nn = require 'fsdp.nn'
local autograd = require 'fsdp.autograd'
local collectives = require 'fsdp.tp.collectives'
local shard_init = require 'fsdp.tp.shard_init'
local tp_ce = require 'fsdp.tp.cross_entropy'

local M = {}

local function pack(...) return { n = select('#', ...), ... } end

M.NAMES = { colwise = true, rowwise = true, vocab_embedding = true, vocab_head = true, attention = true,
            region = true, sequence = true }

-- The sequence dim of the hidden states [B, S, dim] under sequence parallelism.
M.SEQ_DIM = 1

local function is(m, cls) return cls ~= nil and m:is_instance_of(cls) end
local function is_lora(m) return is(m, nn.LoRALinear) end
local function is_linear(m) return is(m, nn.Linear) or is_lora(m) end

local function label(name) return name == '' and '(the root)' or name end

local function need(ok, fmt, ...)
  if not ok then core.fail('tp.parallelize: ' .. fmt:format(...)) end
end

-- checks ---------------------------------------------------------------------------

local checks = {}

function checks.colwise(m, name, T)
  need(is_linear(m), "%s is a %s; 'colwise' takes a Linear", label(name), m:class_name())
  need(m.out_features % T == 0, '%s: out_features %d is not divisible by tp %d', label(name), m.out_features, T)
end

function checks.rowwise(m, name, T)
  need(is_linear(m), "%s is a %s; 'rowwise' takes a Linear", label(name), m:class_name())
  need(m.in_features % T == 0, '%s: in_features %d is not divisible by tp %d', label(name), m.in_features, T)
end

function checks.vocab_embedding(m, name, T)
  need(is(m, nn.Embedding), "%s is a %s; 'vocab_embedding' takes an Embedding", label(name), m:class_name())
  need(m.num_embeddings % T == 0, '%s: vocab %d is not divisible by tp %d', label(name), m.num_embeddings, T)
end

function checks.vocab_head(m, name, T)
  need(is(m, nn.Linear) and not is_lora(m), "%s is a %s; 'vocab_head' takes a plain Linear (a LoRA head is not "
    .. 'supported with TP)', label(name), m:class_name())
  need(m.bias == nil, "%s: 'vocab_head' takes a bias-free Linear", label(name))
  need(m.out_features % T == 0, '%s: vocab %d is not divisible by tp %d', label(name), m.out_features, T)
end

-- The attention's own checks, and its projections' styles in `styles`
-- (name -> style of the whole plan).
function checks.attention(m, name, T, styles)
  need(is(m, nn.Attention), "%s is a %s; 'attention' takes an nn.Attention", label(name), m:class_name())
  need(not m.fused_qkv, '%s: a fused qkv projection is not supported with TP yet (q, k and v would each '
    .. 'need their heads split)', label(name))
  local qn = rawget(m, '_modules').q_norm
  need(qn == nil or qn.weight == nil or qn.weight:numel() == m.head_dim, '%s: a q/k norm over the whole '
    .. 'projection (OLMo 2) is not supported with TP (it would need the norm all-reduced)', label(name))
  need(m.n_heads % T == 0, '%s: n_heads %d is not divisible by tp %d', label(name), m.n_heads, T)
  need(m.n_kv_heads % T == 0, '%s: n_kv_heads %d is not divisible by tp %d', label(name), m.n_kv_heads, T)
  local n = m._names
  local prefix = name == '' and '' or name .. '.'
  for _, k in ipairs({ 'q', 'k', 'v' }) do
    need(styles[prefix .. n[k]] == 'colwise', "%s: its %s must be 'colwise' in the plan (is %s)", label(name),
      n[k], tostring(styles[prefix .. n[k]]))
  end
  need(styles[prefix .. n.o] == 'rowwise', "%s: its %s must be 'rowwise' in the plan (is %s)", label(name), n.o,
    tostring(styles[prefix .. n.o]))
end

function checks.region() end

function checks.sequence() end

function M.check(style, m, name, T, styles)
  if is_lora(m) then
    need(style ~= 'vocab_head', '%s: a LoRA head is not supported with TP', label(name))
    need((m.lora_dropout.p or 0) == 0, '%s: LoRA dropout %s with TP is not supported (each rank would drop '
      .. 'different elements)', label(name), tostring(m.lora_dropout.p))
  end
  checks[style](m, name, T, styles)
end

-- parameters -------------------------------------------------------------------------

-- Replace m's parameter `pname` by this rank's shard along dim (shared
-- tensors through ctx.done stay shared).
local function shard_param(m, pname, dim, ctx, fqn)
  local t = rawget(m, '_parameters')[pname]
  if t == nil then return end
  local done = ctx.done[t]
  if done then
    if done.tp.dim ~= dim then
      core.fail(('tp.parallelize: %s is shared with a parameter split on dim %d, here on dim %d'):format(
        fqn, done.tp.dim, dim))
    end
    m:register_parameter(pname, done)
    return
  end
  need(rawget(t, 'tp') == nil, '%s is already TP-sharded', fqn)
  local T, r = ctx.size, ctx.rank
  local global = t.shape
  need(global[dim + 1] % T == 0, '%s: size %d of dim %d is not divisible by tp %d', fqn, global[dim + 1], dim, T)
  local tp = { dim = dim, size = T, rank = r, global_shape = global }
  local shape = {}
  for i, s in ipairs(global) do shape[i] = s end
  shape[dim + 1] = global[dim + 1] / T
  local new
  if t:has_storage() then
    new = autograd.no_grad(function() return shard_init.slice(t:detach(), tp) end)
  else
    new = factories.empty(shape, { device = t:is_meta() and 'meta' or t.device, dtype = t.dtype,
                                   fake = t:is_fake() or nil })
  end
  for k, v in pairs(t) do
    if type(k) == 'string' and k:sub(1, 1) ~= '_' and k ~= 'init' and rawget(new, k) == nil then rawset(new, k, v) end
  end
  parameter.mark(new, shard_init.rule(rawget(t, 'init'), tp, fqn))
  if new:is_floating_point() then new:requires_grad_(t.requires_grad and true or false) end
  rawset(new, 'tp', tp)
  ctx.done[t] = new
  m:register_parameter(pname, new)
end

local function join(name, k) return name == '' and k or name .. '.' .. k end

-- forwards -------------------------------------------------------------------------

-- The base product of a Linear or LoRALinear in x's dtype (LoRA's frozen
-- base may be kept in another).
local function base_linear(m, x, bias)
  local w, b = m.weight, bias
  if w.dtype ~= x.dtype then w = w:to({ dtype = x.dtype }) end
  if b ~= nil and b.dtype ~= x.dtype then b = b:to({ dtype = x.dtype }) end
  return F.linear(x, w, b)
end

-- Call fn(...) with the parameters of m and its children used through
-- copy_to: identity forward, their gradients all-reduced over the group in
-- backward ([Note: sequence parallelism]: a replicated parameter that sees
-- only this rank's rows). The slots are restored before returning.
local function with_summed_grads(m, g, fn, ...)
  local saved = {}
  for _, sub in ipairs(m:modules()) do
    local ps = rawget(sub, '_parameters')
    for k, p in pairs(ps) do
      saved[#saved + 1] = { ps, k, p }
      ps[k] = collectives.copy_to(p, g)
    end
  end
  local res = pack(pcall(fn, ...))
  for _, e in ipairs(saved) do e[1][e[2]] = e[3] end
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end
M.with_summed_grads = with_summed_grads

local function gather_seq(x, g)
  return collectives.gather(x, M.SEQ_DIM, g, { backward = 'reduce_scatter' })
end

local apply = {}

function apply.colwise(m, name, ctx)
  shard_param(m, 'weight', 0, ctx, join(name, 'weight'))
  shard_param(m, 'bias', 0, ctx, join(name, 'bias'))
  local g = ctx.group
  m.out_features = m.out_features / ctx.size
  -- (in a region the region's copy_to, or its gather under SP, sums the input's gradient: [Note: TP regions])
  local inside = ctx.in_region(name)
  local copy_to = inside and function(x) return x end or function(x) return collectives.copy_to(x, g) end
  if is_lora(m) then
    shard_param(m.lora_B, 'weight', 0, ctx, join(name, 'lora_B.weight'))
    m.lora_B.out_features = m.lora_B.out_features / ctx.size
    rawset(m, 'forward', function(self, x)
      local y = base_linear(self, copy_to(x), self.bias)
      local u
      if inside then
        -- lora_A's output gets only this rank's share of du (lora_B's rows):
        -- its input's gradient is summed by the region, its weight's here
        u = with_summed_grads(self.lora_A, g, self.lora_A, x)
      else
        u = collectives.copy_to(self.lora_A(x), g)
      end
      return y + self.lora_B(u) * self.scaling
    end)
  else
    rawset(m, 'forward', function(self, x) return F.linear(copy_to(x), self.weight, self.bias) end)
  end
end

function apply.rowwise(m, name, ctx)
  shard_param(m, 'weight', 1, ctx, join(name, 'weight'))
  local g = ctx.group
  m.in_features = m.in_features / ctx.size
  local reduce, bias_of
  if ctx.sp then
    reduce = function(y) return collectives.reduce_scatter(y, M.SEQ_DIM, g) end
    bias_of = function(b) return collectives.copy_to(b, g) end
  else
    reduce = function(y) return collectives.reduce_from(y, g) end
    bias_of = function(b) return b end
  end
  if is_lora(m) then
    shard_param(m.lora_A, 'weight', 1, ctx, join(name, 'lora_A.weight'))
    m.lora_A.in_features = m.lora_A.in_features / ctx.size
    rawset(m, 'forward', function(self, x)
      local y = reduce(base_linear(self, x, nil))
      if self.bias ~= nil then
        local b = bias_of(self.bias)
        y = y + (b.dtype ~= y.dtype and b:to({ dtype = y.dtype }) or b)
      end
      local u = reduce(self.lora_A(x))
      local v = ctx.sp and with_summed_grads(self.lora_B, g, self.lora_B, u) or self.lora_B(u)
      return y + v * self.scaling
    end)
  else
    rawset(m, 'forward', function(self, x)
      local y = reduce(F.linear(x, self.weight))
      if self.bias ~= nil then y = y + bias_of(self.bias) end
      return y
    end)
  end
end

-- Under SP the sequence must split evenly over the group (checked here,
-- where it enters: the embedding's ids, the head's rows).
local function check_rows(n, ctx, name)
  if n % ctx.size ~= 0 then
    core.fail(('tp sequence parallel: in %s, sequence length %d is not divisible by tp %d'):format(
      label(name), n, ctx.size))
  end
end

-- A vocabulary split: this rank's rows of m's weight (the vocabulary
-- entries start .. start + rows - 1), m's size field narrowed to them.
-- Returns rows, start, the TP group.
local function split_vocab(m, name, ctx, size_field)
  shard_param(m, 'weight', 0, ctx, join(name, 'weight'))
  local rows = m[size_field] / ctx.size
  local start = ctx.rank * rows
  m[size_field] = rows
  m.vocab_start = start
  return rows, start, ctx.group
end

function apply.vocab_embedding(m, name, ctx)
  local rows, start, g = split_vocab(m, name, ctx, 'num_embeddings')
  rawset(m, 'forward', function(self, ids)
    local rel = ids - start
    local idx = F.clamp(rel, 0, rows - 1)
    local e = F.embedding(idx, self.weight)
    e = F.where(F.eq(idx, rel):unsqueeze(-1), e, 0)
    if ctx.sp then
      check_rows(e:size(M.SEQ_DIM), ctx, name)
      return collectives.reduce_scatter(e, M.SEQ_DIM, g)
    end
    return collectives.reduce_from(e, g)
  end)
end

function apply.vocab_head(m, name, ctx)
  local _, start, g = split_vocab(m, name, ctx, 'out_features')
  rawset(m, 'forward', function(self, x, ce)
    -- (under SP the gather's reduce-scatter backward sums the partial input gradients)
    local z = F.linear(ctx.sp and gather_seq(x, g) or collectives.copy_to(x, g), self.weight)
    if ce ~= nil then
      return tp_ce.cross_entropy(z, ce.targets, { group = g, vocab_start = start, ignore_index = ce.ignore_index,
        reduction = ce.reduction, label_smoothing = ce.label_smoothing })
    end
    return collectives.gather(z, -1, g)
  end)
end

-- A region's input ([Note: TP regions]): copied in (copy_to) once for its
-- colwise layers, or under SP gathered along the sequence, before the
-- module's own forward. An attention's context (opts.context: a
-- cross-attention's k and v project it) is copied in too.
local function region_input(m, ctx, context)
  local inner, g = m.forward, ctx.group
  local enter
  if ctx.sp then
    enter = function(x) return gather_seq(x, g) end
  else
    enter = function(x) return collectives.copy_to(x, g) end
  end
  rawset(m, 'forward', function(self, x, opts, ...)
    if context and type(opts) == 'table' and opts.context ~= nil then
      local o = {}
      for k, v in pairs(opts) do o[k] = v end
      o.context = collectives.copy_to(opts.context, g)
      opts = o
    end
    return inner(self, enter(x), opts, ...)
  end)
end

-- A replicated module that sees only this rank's share of a sum: its
-- parameters' gradients are summed over the group (with_summed_grads).
local function sum_grads_of(m, g)
  local inner = m.forward
  rawset(m, 'forward', function(self, ...) return with_summed_grads(self, g, inner, self, ...) end)
end

-- A q/k norm per head (Qwen 3, Gemma 3) is replicated but normalises only
-- this rank's heads: its weight's gradient is this rank's heads' part.
function apply.attention(m, _, ctx)
  m.n_heads = m.n_heads / ctx.size
  m.n_kv_heads = m.n_kv_heads / ctx.size
  local proj = {}
  for _, k in ipairs({ 'q', 'k', 'v', 'o' }) do proj[m._names[k]] = true end
  for _, nc in ipairs(m:named_children()) do
    if not proj[nc[1]] and #nc[2]:parameters() > 0 then sum_grads_of(nc[2], ctx.group) end
  end
  region_input(m, ctx, true)
end

function apply.region(m, _, ctx) region_input(m, ctx) end

function apply.sequence(m, _, ctx)
  if ctx.sp then sum_grads_of(m, ctx.group) end
end

function M.apply(style, m, name, ctx) apply[style](m, name, ctx) end

return M
