-- models/moe_keys.lua: the names mixture-of-experts checkpoints store on
-- disk, one tensor per expert and projection, and transformers 5's fused
-- layout that nn.MoE holds (transformers' conversion_mapping.py does the
-- same renaming and fusing when it loads).
--
--   local moe_keys = require 'models.moe_keys'
--   local L = moe_keys.layout('mixtral')          -- or 'qwen3_moe'
--   moe_keys.fused_of(L, 'model.layers.3.block_sparse_moe.experts.5.w1.weight')
--     --> 'model.layers.3.mlp.experts.gate_up_proj', 5, 'gate'
--   moe_keys.fused_of(L, 'model.layers.3.block_sparse_moe.gate.weight')
--     --> 'model.layers.3.mlp.gate.weight'           (a rename, no expert)
--   moe_keys.disk_of(L, 'model.layers.3.mlp.experts.down_proj', 8)
--     --> { {name = 'model.layers.3.block_sparse_moe.experts.0.w2.weight', expert = 0, part = 'down'}, ... }
--   moe_keys.copy_expert(fused, 5, 'gate', t)      -- t [ff, h] into fused[5, :ff, :]
--   moe_keys.expert_view(fused, 5, 'gate')         -- that slice (a view)
--   moe_keys.fuse(L, tensors)                      -- a {name = tensor} table in disk names
--                                                   -- -> the same in fused names
--   moe_keys.split(L, tensors)                     -- and back (views; :contiguous() to write)
--
-- Layouts. Mixtral: block_sparse_moe.gate.weight and
-- block_sparse_moe.experts.E.{w1,w3,w2}.weight (w1 = gate [ff, h], w3 = up
-- [ff, h], w2 = down [h, ff]), renamed under mlp. Qwen3-MoE (transformers'
-- qwen2_moe rule, also OLMoE, DeepSeek-V2/V3's routed experts ...):
-- mlp.experts.E.{gate_proj,up_proj,down_proj}.weight; the router keeps its
-- name mlp.gate.weight. Fused: mlp.experts.gate_up_proj [E, 2ff, h] (the
-- gate rows first, then up) and mlp.experts.down_proj [E, h, ff].
--
-- fused_of/disk_of work on names only, so a loader can plan a streamed
-- load (which file tensor goes where) and an exporter can declare what it
-- will write before any tensor exists; copy_expert/expert_view move one
-- expert at a time, so neither side holds a second copy of the experts.
local core = require 'fsdp.core'
local autograd = require 'fsdp.autograd'
local fsdp = require 'fsdp'

local M = {}

local LAYOUTS = {
  mixtral = {
    name = 'mixtral',
    block = 'block_sparse_moe',
    parts = { w1 = 'gate', w3 = 'up', w2 = 'down' },
    disk_part = { gate = 'w1', up = 'w3', down = 'w2' },
  },
  qwen3_moe = {
    name = 'qwen3_moe',
    block = 'mlp',
    parts = { gate_proj = 'gate', up_proj = 'up', down_proj = 'down' },
    disk_part = { gate = 'gate_proj', up = 'up_proj', down = 'down_proj' },
  },
}
LAYOUTS.qwen2_moe = LAYOUTS.qwen3_moe

-- The layout of a model_type ('mixtral', 'qwen3_moe', 'qwen2_moe').
function M.layout(model_type)
  local L = LAYOUTS[model_type]
  if not L then
    core.fail(("moe_keys: no per-expert key layout for model_type '%s' (known: mixtral, qwen3_moe, "
      .. "qwen2_moe)"):format(tostring(model_type)))
  end
  return L
end

local function escape(s) return (s:gsub('%p', '%%%0')) end

-- A disk name -> the fused name, and for expert tensors the expert index
-- and part ('gate', 'up', 'down'). nil for names the layout leaves alone.
function M.fused_of(L, name)
  local b = escape(L.block)
  local prefix, e, part = name:match('^(.-)%.?' .. b .. '%.experts%.(%d+)%.([%w_]+)%.weight$')
  if prefix and L.parts[part] then
    local p = L.parts[part]
    local sep = prefix == '' and '' or '.'
    return prefix .. sep .. 'mlp.experts.' .. (p == 'down' and 'down_proj' or 'gate_up_proj'), tonumber(e), p
  end
  if L.block ~= 'mlp' then
    local pre, rest = name:match('^(.-)' .. b .. '%.(.*)$')
    if pre and (pre == '' or pre:sub(-1) == '.') then return pre .. 'mlp.' .. rest end
  end
  return nil
end

-- A fused name -> what the disk holds for it: a list of {name, expert,
-- part} (n_experts of them for down_proj, 2 * n_experts for gate_up_proj,
-- gate before up within an expert), or {{name = disk router name}} for the
-- router; nil for other names.
function M.disk_of(L, name, n_experts)
  local prefix, which = name:match('^(.-)%.?mlp%.experts%.([%w_]+)$')
  local sep = prefix and prefix ~= '' and '.' or ''
  if prefix and (which == 'gate_up_proj' or which == 'down_proj') then
    local out = {}
    local parts = which == 'down_proj' and { 'down' } or { 'gate', 'up' }
    for e = 0, n_experts - 1 do
      for _, p in ipairs(parts) do
        out[#out + 1] = { name = ('%s%s%s.experts.%d.%s.weight'):format(prefix, sep, L.block, e, L.disk_part[p]),
                          expert = e, part = p }
      end
    end
    return out
  end
  local pre = name:match('^(.-)mlp%.gate%.weight$')
  if pre and (pre == '' or pre:sub(-1) == '.') then
    return { { name = pre .. L.block .. '.gate.weight' } }
  end
  return nil
end

-- The slice of a fused tensor that one expert's part occupies: gate
-- [e, :ff, :], up [e, ff:, :] of gate_up_proj [E, 2ff, h]; down [e] of
-- down_proj [E, h, ff]. A view (shares memory).
function M.expert_view(fused, e, part)
  local m = fused:select(0, e)
  if part == 'down' then return m end
  local ff = math.floor(fused.shape[2] / 2)
  if part == 'gate' then return m:narrow(0, 0, ff) end
  if part == 'up' then return m:narrow(0, ff, ff) end
  core.fail(("moe_keys: part must be 'gate', 'up' or 'down', got %s"):format(tostring(part)))
end

-- Copy one expert's tensor as the disk holds it into its slice of the
-- fused tensor, checking the shape (the message names both).
function M.copy_expert(fused, e, part, t)
  local dst = M.expert_view(fused, e, part)
  if core.format_shape(dst.shape) ~= core.format_shape(t.shape) then
    core.fail(('moe_keys: expert %d %s of shape %s does not fit %s (its slice of %s)'):format(
      e, part, core.format_shape(t.shape), core.format_shape(dst.shape), core.format_shape(fused.shape)))
  end
  autograd.no_grad(function() dst:copy_(t) end)
end

-- {disk name = tensor} -> {fused name = tensor}: each fused tensor built
-- from all its experts (missing ones named), other names passed through.
function M.fuse(L, tensors)
  local groups, out = {}, {}
  for name, t in pairs(tensors) do
    local fused, e, part = M.fused_of(L, name)
    if not fused then out[name] = t
    elseif not e then out[fused] = t
    else
      local g = groups[fused] or { experts = {}, n = 0 }
      groups[fused] = g
      g.experts[e] = g.experts[e] or {}
      g.experts[e][part] = t
      g.n = math.max(g.n, e + 1)
      g.like = t
    end
  end
  for fused, g in pairs(groups) do
    local down = fused:match('down_proj$') ~= nil
    local parts = down and { 'down' } or { 'gate', 'up' }
    local s = g.like.shape
    local shape = down and { g.n, s[1], s[2] } or { g.n, 2 * s[1], s[2] }
    local t = fsdp.empty(shape, { dtype = g.like.dtype, device = g.like.device })
    for e = 0, g.n - 1 do
      for _, p in ipairs(parts) do
        local src = g.experts[e] and g.experts[e][p]
        if not src then
          core.fail(('moe_keys: %s: expert %d has no %s tensor (%s)'):format(fused, e, p,
            M.disk_of(L, fused, g.n)[down and e + 1 or 2 * e + (p == 'gate' and 1 or 2)].name))
        end
        M.copy_expert(t, e, p, src)
      end
    end
    out[fused] = t
  end
  return out
end

-- {fused name = tensor} -> {disk name = tensor}: experts as views of the
-- fused tensors, the router renamed, other names passed through.
function M.split(L, tensors)
  local out = {}
  for name, t in pairs(tensors) do
    local disk = M.disk_of(L, name, t.ndim == 3 and t.shape[1] or 0)
    if not disk then out[name] = t
    elseif not disk[1].expert then out[disk[1].name] = t
    else
      for _, d in ipairs(disk) do out[d.name] = M.expert_view(t, d.expert, d.part) end
    end
  end
  return out
end

return M
