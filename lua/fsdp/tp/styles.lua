-- fsdp.tp.styles: what each TP style does to a module: its parameters
-- replaced by this rank's shards (same names, p.tp set) and its forward
-- by the parallel one. fsdp.tp (init.lua) checks a whole plan first
-- (check), then applies it (apply), so a bad plan changes nothing.
--
--   colwise          Linear [out, in]: weight and bias split by rows (dim 0); input copied in
--                    (copy_to: all-reduce of its gradient), output this rank's features
--   rowwise          Linear: weight split by columns (dim 1), input this rank's features;
--                    one all-reduce of the output (reduce_from), then the (replicated) bias
--   vocab_embedding  Embedding [V, D] split by rows; ids outside this rank's rows give 0;
--                    one all-reduce of the output
--   vocab_head       bias-free Linear [V, D] split by rows; with a loss (forward(x, ce)) the
--                    vocab-parallel cross-entropy (fsdp.tp.cross_entropy), else the logits
--                    gathered on the last dim
--   attention        nn.Attention: n_heads and n_kv_heads divided by the TP size (its q/k/v
--                    must be colwise and o rowwise in the same plan)
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

M.NAMES = { colwise = true, rowwise = true, vocab_embedding = true, vocab_head = true, attention = true }

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

local apply = {}

function apply.colwise(m, name, ctx)
  shard_param(m, 'weight', 0, ctx, join(name, 'weight'))
  shard_param(m, 'bias', 0, ctx, join(name, 'bias'))
  local g = ctx.group
  m.out_features = m.out_features / ctx.size
  if is_lora(m) then
    shard_param(m.lora_B, 'weight', 0, ctx, join(name, 'lora_B.weight'))
    m.lora_B.out_features = m.lora_B.out_features / ctx.size
    rawset(m, 'forward', function(self, x)
      local y = base_linear(self, collectives.copy_to(x, g), self.bias)
      local u = collectives.copy_to(self.lora_A(x), g)
      return y + self.lora_B(u) * self.scaling
    end)
  else
    rawset(m, 'forward', function(self, x) return F.linear(collectives.copy_to(x, g), self.weight, self.bias) end)
  end
end

function apply.rowwise(m, name, ctx)
  shard_param(m, 'weight', 1, ctx, join(name, 'weight'))
  local g = ctx.group
  m.in_features = m.in_features / ctx.size
  if is_lora(m) then
    shard_param(m.lora_A, 'weight', 1, ctx, join(name, 'lora_A.weight'))
    m.lora_A.in_features = m.lora_A.in_features / ctx.size
    rawset(m, 'forward', function(self, x)
      local y = collectives.reduce_from(base_linear(self, x, nil), g)
      if self.bias ~= nil then y = y + (self.bias.dtype ~= y.dtype and self.bias:to({ dtype = y.dtype }) or self.bias) end
      local u = collectives.reduce_from(self.lora_A(x), g)
      return y + self.lora_B(u) * self.scaling
    end)
  else
    rawset(m, 'forward', function(self, x)
      local y = collectives.reduce_from(F.linear(x, self.weight), g)
      if self.bias ~= nil then y = y + self.bias end
      return y
    end)
  end
end

function apply.vocab_embedding(m, name, ctx)
  shard_param(m, 'weight', 0, ctx, join(name, 'weight'))
  local rows = m.num_embeddings / ctx.size
  local start, g = ctx.rank * rows, ctx.group
  m.num_embeddings = rows
  m.vocab_start = start
  rawset(m, 'forward', function(self, ids)
    local rel = ids - start
    local idx = F.clamp(rel, 0, rows - 1)
    local e = F.embedding(idx, self.weight)
    e = F.where(F.eq(idx, rel):unsqueeze(-1), e, 0)
    return collectives.reduce_from(e, g)
  end)
end

function apply.vocab_head(m, name, ctx)
  shard_param(m, 'weight', 0, ctx, join(name, 'weight'))
  local rows = m.out_features / ctx.size
  local start, g = ctx.rank * rows, ctx.group
  m.out_features = rows
  m.vocab_start = start
  rawset(m, 'forward', function(self, x, ce)
    local z = F.linear(collectives.copy_to(x, g), self.weight)
    if ce ~= nil then
      return tp_ce.cross_entropy(z, ce.targets, { group = g, vocab_start = start, ignore_index = ce.ignore_index,
        reduction = ce.reduction, label_smoothing = ce.label_smoothing })
    end
    return collectives.gather(z, -1, g)
  end)
end

function apply.attention(m, _, ctx)
  m.n_heads = m.n_heads / ctx.size
  m.n_kv_heads = m.n_kv_heads / ctx.size
end

function M.apply(style, m, name, ctx) apply[style](m, name, ctx) end

return M
