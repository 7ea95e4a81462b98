-- fsdp.plan.tp: tensor parallelism in the planner (issue 43). fsdp.plan
-- with tp = T plans what TP rank 0 of a T-rank group holds and runs: a
-- copy of the (meta) model parallelized by fsdp.tp itself with the
-- model's own plan (model:tp_plan()) over a planning group of size T
-- (fsdp.dist's [Note: planning groups]), which moves nothing and records
-- each TP collective. The trace of that copy (fsdp.plan.trace) then gives
-- the local shards, the local activations and the local FLOPs, and the
-- collectives of every layer; nothing of TP's logic is copied here.
--
-- [Note: TP collectives in the step's time]
-- A TP collective sits between two GEMMs of the same layer: the next op
-- needs its result, so it is on the critical path in forward and in
-- backward (Megatron-LM overlaps none of them by default). Its time adds
-- to compute, at the intra-node link (NVLink: TP groups never straddle a
-- node, [Note: the device mesh]), ring algorithms: an all-reduce of b
-- bytes sends 2(T-1)/T b per rank, an all-gather or reduce-scatter
-- (T-1)/T of the whole buffer. FSDP's collectives (fsdp.plan.cost) still
-- overlap that longer compute. With checkpointing a block's forward
-- collectives run again in backward.
--
-- [Note: sequence parallel in the plan]
-- With sequence_parallel the copy is parallelized with fsdp.tp's own
-- sequence parallelism ({sequence_parallel = true}) and traced like any
-- other: the hidden states between the regions are [B, S/T, dim], the
-- regions gather their input along the sequence and the rowwise layers
-- reduce-scatter, so what each block keeps (and a checkpointed block's
-- input), the gathered inputs the products save whole, the norms' summed
-- weight gradients and the collectives all come from the step itself.
-- (Until fsdp.tp had SP this was a model: every saved byte / T.) The
-- sequence length must divide by T, as for the recipes.
local core = require 'fsdp.core'
local dist = require 'fsdp.dist'
local factories = require 'fsdp.factories'
local nn = require 'fsdp.nn'
local tp = require 'fsdp.tp'

local M = {}

local WHO = 'fsdp.plan'
local function fail(fmt, ...) core.fail(WHO .. ': ' .. fmt:format(...)) end

-- A copy of a meta model: every module a new table of the same class with
-- new meta parameters and buffers (same shapes, dtypes, Lua fields, init
-- rules; shared tensors stay shared), other fields shared, so that
-- fsdp.tp may parallelize the copy and leave the caller's model as it is.
local function copy_model(model)
  local done = {}
  local function tensor(t)
    if done[t] then return done[t] end
    if not (t:is_meta() or t:is_fake()) then
      fail('tp: the model must be built on meta (a parameter or buffer is on %s)', tostring(t.device))
    end
    local n = factories.empty(t.shape, { dtype = t.dtype, device = 'meta' })
    for k, v in pairs(t) do
      if type(k) == 'string' and k:sub(1, 1) ~= '_' then rawset(n, k, v) end
    end
    if t.requires_grad then n:requires_grad_(true) end
    done[t] = n
    return n
  end
  local function module(m, name)
    if done[m] then return done[m] end
    if #rawget(m, '_forward_pre_hooks') > 0 or #rawget(m, '_forward_hooks') > 0 then
      fail('tp: %s has forward hooks; plan the model as built (hooks are the planner\'s to add)',
        name == '' and 'the model' or name)
    end
    local c = {}
    done[m] = c
    for k, v in next, m do
      if type(k) == 'string' and k:sub(1, 1) == '_' and type(v) == 'table' and getmetatable(v) == nil then
        local t = {}
        for kk, vv in pairs(v) do t[kk] = vv end
        v = t
      end
      c[k] = v
    end
    for k, p in pairs(c._parameters) do c._parameters[k] = tensor(p) end
    for k, b in pairs(c._buffers) do c._buffers[k] = tensor(b) end
    for k, ch in pairs(c._modules) do c._modules[k] = module(ch, name == '' and k or name .. '.' .. k) end
    c._parent = m._parent and done[m._parent] or nil
    return setmetatable(c, getmetatable(m))
  end
  return module(model, '')
end

-- The copies parallelized so far: model -> key (T, and SP) -> {model =,
-- group =}. The trace of a copy is cached by its parameters
-- (fsdp.plan.trace), so plans of one model and tp size that differ in
-- anything else trace it once.
local copies = setmetatable({}, { __mode = 'k' })

-- What TP rank 0 of `T` holds of `model` (unsharded, on meta, not already
-- parallelized), with sequence parallelism when `sp`: {model = the
-- parallelized copy, group = its planning group (group.log: the
-- collectives the copy's traces made)}.
function M.parallelized(model, T, sp)
  if rawget(model, '_tp') then
    fail('tp: the model is already tensor-parallel: plan the model as built (the planner parallelizes a copy)')
  end
  if type(model.tp_plan) ~= 'function' then
    fail('tp = %d: %s has no tensor-parallel plan (model:tp_plan())', T, model:class_name())
  end
  local by_key = copies[model] or {}
  copies[model] = by_key
  local key = T .. (sp and '+sp' or '')
  if by_key[key] then return by_key[key] end
  local ok, plan = pcall(model.tp_plan, model)
  if not ok then fail('tp = %d: %s', T, (tostring(plan):gsub('^[^:]*:%d+: ', ''))) end
  local group = dist.planning_group(T, { name = ('tp %d (planned)'):format(T) })
  local copy = copy_model(model)
  local ok2, err = pcall(tp.parallelize, copy, plan, { group = group, sequence_parallel = sp or nil })
  if not ok2 then
    fail('tp = %d%s: %s', T, sp and ' sequence parallel' or '', (tostring(err):gsub('^.-tp%.parallelize: ', '')))
  end
  by_key[key] = { model = copy, group = group }
  return by_key[key]
end

-- Bytes a rank sends for one collective record with ring algorithms.
local function wire_of(c)
  local g = c.size
  if c.kind == 'all_reduce' then return c.bytes * 2 * (g - 1) / g end
  if c.kind == 'broadcast' then return c.bytes end
  return c.bytes * (g - 1) / g
end
M.wire_of = wire_of

-- Sum a list of collective records into comm (by kind: calls, bytes,
-- wire), `times` times over.
local function add(comm, records, times)
  for _, c in ipairs(records) do
    local k = comm[c.kind] or { calls = 0, bytes = 0, wire = 0 }
    comm[c.kind] = k
    k.calls, k.bytes, k.wire = k.calls + times, k.bytes + times * c.bytes, k.wire + times * wire_of(c)
  end
end

-- The TP communication of one step of rank 0 from its trace `tr` (with
-- collectives; [Note: TP collectives in the step's time]): by kind
-- {calls, bytes, wire}, their sum (`calls`, `bytes`, `wire`, `seconds` at
-- bandwidth bw), and one block's own (`per_layer`: forward and backward
-- records of the first block's profile). With checkpoint, each block's
-- forward collectives again.
function M.comm(tr, bw, checkpoint)
  local kinds = {}
  add(kinds, tr.collectives.forward, 1)
  add(kinds, tr.collectives.backward, 1)
  if checkpoint then
    for _, b in ipairs(tr.blocks) do add(kinds, b.collectives and b.collectives.forward or {}, 1) end
  end
  local total = { by_kind = kinds, calls = 0, bytes = 0, wire = 0 }
  for _, k in pairs(kinds) do
    total.calls, total.bytes, total.wire = total.calls + k.calls, total.bytes + k.bytes, total.wire + k.wire
  end
  total.seconds = total.wire / bw
  local first = tr.blocks[1]
  if first and first.collectives then
    local layer = {}
    add(layer, first.collectives.forward, 1)
    add(layer, first.collectives.backward, 1)
    local l = { by_kind = layer, calls = 0, bytes = 0, wire = 0 }
    for _, k in pairs(layer) do l.calls, l.bytes, l.wire = l.calls + k.calls, l.bytes + k.bytes, l.wire + k.wire end
    total.per_layer = l
  end
  return total
end

M.copy_model = copy_model

return M
