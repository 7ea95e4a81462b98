-- fsdp.checkpointing.parts: a model seen as what a sharded checkpoint
-- stores, and where a saved value lands in a model of another shape.
--
-- A *part* is one flat array of the model and this rank's contiguous slice
-- of it: a sharded unit (its flat parameter, padded; the slice is the
-- master shard), or a tensor that is not sharded (a parameter of an
-- ignored module or of an unsharded model, a persistent buffer), which is
-- its own part, whole on every rank. Each part lists its parameters with
-- their offsets in the flat array, so a value is located by (parameter
-- name, element index) alone: that is what makes resharding possible. A
-- checkpoint saved with W ranks, a strategy and a wrap loads into W' ranks,
-- another strategy, or another wrap whose parameter names are the same:
-- for each parameter slice this rank holds now, pieces() finds the saved
-- shards that cover it. A tensor-parallel model (fsdp.tp) has one part per
-- unit and TP rank, its parameters described against the logical tensors
-- ([Note: logical tensors in sharded checkpoints] in
-- fsdp/checkpointing/logical.lua).
local core = require 'fsdp.core'
local dist = require 'fsdp.dist'
local json = require 'fsdp.io.json'

local M = {}

-- This rank's slice of part `key`: {key=, kind=, flat= (1-d tensor),
-- start= (its first element in the whole flat array), len=, numel=,
-- padded_numel=, dtype=, writer= (whether this rank writes it: one replica
-- of each slice), params = {{name=, shape=, offset=, param_start=,
-- shard_start=, len=, tensor=}...}}. param_start: the first element of the
-- parameter this rank holds; shard_start: where it sits in `flat`; tp:
-- the parameter's TP split (p.tp) or nil. `suffix`: '@tp<r>' in a TP
-- model (M.tp_suffix), else ''.
local function whole_part(kind, name, t, writer, suffix)
  if not t:is_contiguous() then
    core.fail(('checkpointing: %s %s is not contiguous'):format(kind, name))
  end
  local n = t:numel()
  return {
    key = kind .. ':' .. name .. (suffix or ''), kind = kind, flat = t:view({ n }), start = 0, len = n, numel = n,
    padded_numel = n, dtype = t.dtype, writer = writer,
    params = { { name = name, shape = t.shape, offset = 0, param_start = 0, shard_start = 0, len = n, tensor = t,
                 tp = rawget(t, 'tp') } },
  }
end

local function unit_part(u, suffix)
  local group_rank = u.shard_group and u.shard_group:rank() or dist.rank()
  local part = {
    key = 'unit:' .. u:label() .. suffix, kind = 'unit', unit = u, flat = u.shard,
    start = group_rank * u.shard_numel, len = u.shard_numel, numel = u.numel,
    padded_numel = u.padded_numel, dtype = u.master_dtype,
    -- Replicas (NO_SHARD, hybrid) hold the same slice: one of them writes.
    writer = u.replicate_group == nil or u.replicate_group:rank() == 0,
    params = {},
  }
  for i, p in ipairs(u.params) do
    if p.len > 0 and p.offset + p.param_start ~= part.start + p.shard_start then
      core.fail(('checkpointing: unit %s: parameter %s sits at %d of the flat parameter, expected %d (shard layout changed?)')
        :format(u:label(), p.name, p.offset + p.param_start, part.start + p.shard_start))
    end
    part.params[i] = { name = p.name, shape = p.shape, offset = p.offset, param_start = p.param_start,
                       shard_start = p.shard_start, len = p.len, tensor = p.segment,
                       tp = p.segment and rawget(p.segment, 'tp') }
  end
  return part
end

-- The TP split of a model's parameters: {size =, rank =} (size 1 without
-- fsdp.tp), and the key suffix of its parts ('@tp<rank>', or '').
function M.tp_of(model)
  local s = rawget(model, '_tp')
  if not s or s.size <= 1 then return { size = 1, rank = 0 }, '' end
  return { size = s.size, rank = s.rank }, ('@tp%d'):format(s.rank)
end

-- The parts of `model`, in model order: its units (root last), then
-- unsharded parameters, then persistent buffers. Frozen parameters (that
-- do not require grad: a LoRA base) are no part of a checkpoint: training
-- does not change them, so a resumed run gets them where the first run
-- did ([Note: what a LoRA checkpoint holds] in lua/fsdp/lora.lua), and a
-- LoRA checkpoint is the size of its adapters. `param_writer`: whether
-- this rank writes the unsharded parameters (default: rank 0; in a TP
-- model one rank per TP rank, which the save works out).
function M.of(model, param_writer)
  if param_writer == nil then param_writer = dist.rank() == 0 end
  local _, suffix = M.tp_of(model)
  local parts = {}
  local S = rawget(model, '_fsdp')
  if S then
    for _, u in ipairs(S.units) do
      if not u.frozen then parts[#parts + 1] = unit_part(u, suffix) end
    end
  end
  local is_param = {}
  for _, np in ipairs(model:named_parameters()) do
    is_param[np[2]] = true
    local frozen = np[2]:is_floating_point() and not np[2].requires_grad
    if rawget(np[2], 'fsdp_unit') == nil and not frozen then
      parts[#parts + 1] = whole_part('param', np[1], np[2], param_writer, suffix)
    end
  end
  local own, keys = model:state_dict()
  for _, key in ipairs(keys) do
    local t = own[key]
    if not is_param[t] and t:has_storage() then
      parts[#parts + 1] = whole_part('buffer', key, t, dist.rank() == 0)
      is_param[t] = true -- a buffer under two names is stored once
    end
  end
  return parts
end

local function array(t)
  local out = json.array({})
  for i, v in ipairs(t) do out[i] = v end
  return out
end

-- The index entry of a part (what every rank agrees on): parameters with
-- their logical shapes and TP splits. `tp_rank`: describe the part as TP
-- rank tp_rank holds it (every TP rank's parts have the same layout, its
-- splits another rank), with that rank's key; default this rank's.
function M.describe(part, tp_rank)
  local params = {}
  local key = part.key
  for i, p in ipairs(part.params) do
    local e = { name = p.name, shape = array(p.shape), offset = p.offset }
    if p.tp then
      e.shape = array(p.tp.global_shape)
      e.tp = { dim = p.tp.dim, size = p.tp.size, rank = tp_rank or p.tp.rank }
    end
    params[i] = e
  end
  if tp_rank then key = key:gsub('@tp%d+$', '') .. ('@tp%d'):format(tp_rank) end
  return { key = key, kind = part.kind, dtype = part.dtype, numel = part.numel,
           padded_numel = part.padded_numel, params = params, shards = {}, optim = {} }
end

-- name -> {shape = the logical shape, sources = {{part = <index entry>,
-- offset =, layout = {shape =, tp =}}...}} over a checkpoint's parts: a
-- TP-split parameter has one source per TP rank (sorted by rank), a
-- replicated one the first part holding it (its copies in the other TP
-- ranks' parts are equal). A parameter saved twice otherwise, a TP rank
-- missing or two splits of one name is an error (the index is damaged).
function M.saved_params(index)
  local map = {}
  local function damaged(fmt, ...)
    core.fail(('checkpoint index %s: ' .. fmt):format(index.path, ...))
  end
  for _, part in ipairs(index.parts) do
    for _, p in ipairs(part.params) do
      local e = map[p.name]
      local src = { part = part, offset = p.offset, layout = { shape = p.shape, tp = p.tp } }
      if not e then
        map[p.name] = { shape = p.shape, sources = { src }, split = p.tp }
      elseif not p.tp and not e.split and (part.key:match('@tp%d+$') and e.sources[1].part.key:match('@tp%d+$')) then
        -- (a replicated parameter's copy in another TP rank's part)
      elseif p.tp and e.split and p.tp.dim == e.split.dim and p.tp.size == e.split.size then
        e.sources[#e.sources + 1] = src
      else
        damaged('parameter %s is in parts %s and %s', p.name, e.sources[1].part.key, part.key)
      end
    end
  end
  for name, e in pairs(map) do
    if e.split and #e.sources ~= e.split.size then
      damaged('parameter %s is split over %d TP ranks, but %d slices are listed', name, e.split.size, #e.sources)
    elseif e.split then
      table.sort(e.sources, function(a, b) return a.layout.tp.rank < b.layout.tp.rank end)
      local count = {}
      for _, src in ipairs(e.sources) do count[src.layout.tp.rank] = (count[src.layout.tp.rank] or 0) + 1 end
      for r = 0, e.split.size - 1 do
        if count[r] ~= 1 then
          damaged('parameter %s is split over %d TP ranks, but TP rank %d\'s slice is %s', name, e.split.size, r,
            count[r] and ('listed %d times'):format(count[r]) or 'missing')
        end
      end
    end
  end
  return map
end

-- Where the saved elements [first, first + len) of a saved part's flat
-- array are: {{rank=, src= (offset in that rank's saved slice), dst=
-- (offset from first), len=}...}. Fails unless the saved shards cover the
-- whole range (a rank's file missing from the index).
function M.pieces(part, first, len, what)
  local out, covered = {}, 0
  for _, sh in ipairs(part.shards) do
    local a = math.max(first, sh.start)
    local b = math.min(first + len, sh.start + sh.len)
    if a < b then
      out[#out + 1] = { rank = sh.rank, src = a - sh.start, dst = a - first, len = b - a }
      covered = covered + (b - a)
    end
  end
  if covered ~= len then
    core.fail(('checkpoint: %s: the saved shards of %s cover %d of its %d elements [%d, %d)')
      :format(what, part.key, covered, len, first, first + len))
  end
  return out
end

return M
