-- models/families/shared.lua: config.json translation that several family
-- declarations share (their `hf.from_hf` / `hf.to_hf` hooks, called by
-- models/hf.lua with ctx = {where, fail(fmt, ...), rope(h) -> theta,
-- scaling, float, null, layer_types(c)}): Qwen's optional sliding window
-- and Gemma's sliding pattern and RoPE tables.
local validate = require 'fsdp.validate'
local json = require 'fsdp.io.json'

local M = {}

local function null(v) return v == nil or v == json.null end

local function set(list)
  local s = {}
  for _, k in ipairs(list) do s[k] = true end
  return s
end

local function has_sliding(types)
  for _, t in ipairs(type(types) == 'table' and types or {}) do
    if t == 'sliding_attention' then return true end
  end
  return false
end

local LAYER_TYPES = set({ 'sliding_attention', 'full_attention' })

-- layer_types as the file gives it (a list of one known type per layer:
-- transformers' validate_layer_type refuses other lists even where no
-- window is on, as Qwen's use_sliding_window false), or nil.
local function layer_types(h, c, ctx)
  local t = h.layer_types
  if null(t) then return nil end
  if type(t) ~= 'table' then ctx.fail('layer_types must be a list, got %s', validate.show(t)) end
  local copy, n = {}, 0
  for i, v in ipairs(t) do copy[i] = v end
  for _ in pairs(t) do n = n + 1 end
  if n ~= #copy then ctx.fail('layer_types must be a list, got %s', validate.show(t)) end
  if type(c.n_layers) == 'number' and #copy ~= c.n_layers then
    ctx.fail('layer_types lists %d types for num_hidden_layers %s: %s', #copy, validate.show(c.n_layers),
      validate.show(t))
  end
  for i, v in ipairs(copy) do
    if not LAYER_TYPES[v] then
      ctx.fail("layer_types[%d] is %s; only 'sliding_attention' and 'full_attention' are supported", i - 1,
        validate.show(v))
    end
  end
  return copy
end

local function window(h, ctx)
  if null(h.sliding_window) then return nil end
  local why = validate.problem(h.sliding_window, validate.COUNT)
  if why then ctx.fail('sliding_window %s', why) end
  return h.sliding_window
end

-- Qwen 2 / 3: sliding_window counts only with use_sliding_window (class
-- default false); then layers >= max_window_layers slide unless
-- layer_types says which.
M.QWEN_WINDOW_KEYS = set({ 'use_sliding_window', 'sliding_window', 'max_window_layers', 'layer_types' })

function M.qwen_window_from_hf(h, c, ctx)
  local use = h.use_sliding_window
  if null(use) then use = false end
  if type(use) ~= 'boolean' then ctx.fail('use_sliding_window must be true or false, got %s', validate.show(use)) end
  local mwl = h.max_window_layers
  if not null(mwl) and validate.problem(mwl, validate.INDEX) then
    ctx.fail('max_window_layers %s', validate.problem(mwl, validate.INDEX))
  end
  local types, W = layer_types(h, c, ctx), window(h, ctx)
  if not (use and W) then
    if has_sliding(types) then
      ctx.fail("layer_types has 'sliding_attention' layers, but %s", use and 'sliding_window is null'
        or 'use_sliding_window is false')
    end
    return
  end
  c.sliding_window = W
  if not types then
    types = {}
    for i = 1, c.n_layers or 0 do
      types[i] = (i - 1) >= (null(mwl) and 28 or mwl) and 'sliding_attention' or 'full_attention'
    end
  end
  c.layer_types = types
end

function M.qwen_window_to_hf(c, out, ctx)
  out.use_sliding_window = c.sliding_window ~= nil
  out.sliding_window = c.sliding_window or ctx.null
  out.max_window_layers = c.n_layers
  out.layer_types = ctx.layer_types(c)
end

-- Gemma 2 / 3: layer_types, else a period (gemma2: 2, even layers slide;
-- gemma3: sliding_window_pattern 6, every sixth layer is global).
M.GEMMA_WINDOW_KEYS = set({ 'sliding_window', 'layer_types', 'sliding_window_pattern', '_sliding_window_pattern' })

function M.gemma_window_from_hf(h, c, ctx, period)
  local types, W = layer_types(h, c, ctx), window(h, ctx)
  local p = h.sliding_window_pattern
  if null(p) then p = h._sliding_window_pattern end
  if not null(p) then
    local why = validate.problem(p, validate.COUNT)
    if why then ctx.fail('sliding_window_pattern %s', why) end
    period = p
  end
  c.sliding_window = W
  if types then c.layer_types = types else c.sliding_pattern = period end
  if not W and (has_sliding(types) or (not types and period > 1)) then
    ctx.fail("sliding_window is null, but the config has sliding layers (layer_types or its pattern)")
  end
end

function M.gemma_window_to_hf(c, out, ctx)
  out.sliding_window = c.sliding_window or ctx.null
  out.layer_types = ctx.layer_types(c)
  if c.sliding_pattern then out.sliding_window_pattern = c.sliding_pattern end
end

return M
