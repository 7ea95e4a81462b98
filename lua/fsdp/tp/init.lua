-- fsdp.tp: tensor parallelism inside a node (Megatron-LM style), composed
-- with fsdp.shard across nodes (issue 43: TP x FSDP).
--
--   local tp = require 'fsdp.tp'
--   local model = llama.CausalLM(cfg, {device = 'meta'})
--   tp.parallelize(model, model:tp_plan(), {mesh = mesh})    -- or {group = tp_group}
--   fsdp.shard(model, {group = dp_group, policy = ...})      -- shards the local TP shards
--   ... loss:backward(); fsdp.clip_grad_norm(model, 1.0); opt:step()
--
-- A plan is a list of {match = 'lua pattern on the module name' | function(module, name),
-- style = 'colwise' | 'rowwise' | 'vocab_embedding' | 'vocab_head' | 'attention'}
-- (fsdp.tp.styles says what each does); each module takes the style of the
-- first entry it matches. Models declare their plan (models/decoder.lua:
-- CausalLM:tp_plan()). parallelize runs on the meta (or fake, or a live)
-- model before fsdp.shard: every matched module's parameters become this
-- rank's shards, with the same names, values keyed by their global index
-- ([Note: TP init keying] in fsdp/tp/shard_init.lua), and each carries
-- p.tp = {dim =, size =, rank =, global_shape =}; replicated parameters
-- have no p.tp. The whole plan is checked before anything changes: sizes
-- not divisible by the TP size, a style on the wrong module, a mixture of
-- experts, all fail with one line naming the module and the sizes.
--
-- Every rank of a TP group must see the same input (the same data-parallel
-- rank's batch); their losses are then equal.
--
-- {sequence_parallel = true} (Megatron-LM's sequence parallelism, [Note:
-- sequence parallelism] in fsdp/tp/styles.lua): the hidden states between
-- the TP regions hold this rank's 1/T of the sequence; the plan must then
-- name the regions ('attention', 'region') and the modules between them
-- that hold parameters ('sequence': the norms), which is checked.
local core = require 'fsdp.core'
local dist = require 'fsdp.dist'
local nn = require 'fsdp.nn'
local styles = require 'fsdp.tp.styles'
local sharding = require 'fsdp.sharding'

local M = {}

M.collectives = require 'fsdp.tp.collectives'
M.cross_entropy = require('fsdp.tp.cross_entropy').cross_entropy
M.shard_init = require 'fsdp.tp.shard_init'

local function fail(fmt, ...) core.fail('tp.parallelize: ' .. fmt:format(...)) end

-- The TP group from opts: {group = Group} or {mesh = anything with :group('tp')}.
local function group_of(opts)
  if type(opts) ~= 'table' then fail('expected options {mesh = m} or {group = g}, got %s', type(opts)) end
  local g = opts.group
  if g == nil and opts.mesh ~= nil then
    if type(opts.mesh) ~= 'table' or type(opts.mesh.group) ~= 'function' then
      fail('opts.mesh has no :group(dim) method')
    end
    g = opts.mesh:group('tp')
  end
  if g == nil then fail('needs {mesh = m} (its tp dimension) or {group = g} (an fsdp.dist Group)') end
  if getmetatable(g) ~= dist.Group then fail('the tp group is a %s, not an fsdp.dist Group', type(g)) end
  if not g:is_member() then fail('this rank is not a member of the tp group %s', g:name()) end
  return g
end

local function check_plan(plan)
  if type(plan) ~= 'table' or #plan == 0 then fail('the plan must be a non-empty list of {match =, style =}') end
  for i, e in ipairs(plan) do
    if type(e) ~= 'table' or (type(e.match) ~= 'string' and type(e.match) ~= 'function') then
      fail('plan entry %d needs match = a name pattern or a function(module, name)', i)
    end
    if not styles.NAMES[e.style] then
      fail("plan entry %d: unknown style %s (known: colwise, rowwise, vocab_embedding, vocab_head, attention, "
        .. 'region, sequence)',
        i, tostring(e.style))
    end
  end
end

local function style_of(plan, m, name)
  for _, e in ipairs(plan) do
    local hit
    if type(e.match) == 'string' then hit = name:match(e.match) ~= nil else hit = e.match(m, name) end
    if hit then return e.style end
  end
  return nil
end

local function label(name) return name == '' and '(the root)' or name end

-- The nearest module above `name` (itself excluded) in `set`, or nil.
local function ancestor_in(name, set)
  if name == '' then return nil end
  local n = name
  while true do
    n = n:match('^(.*)%.[^.]+$')
    if n == nil then return set[''] and '' or nil end
    if set[n] then return n end
  end
end

-- The regions of the plan (name -> true: its 'attention' and 'region'
-- modules, [Note: TP regions] in fsdp/tp/styles.lua), none inside another
-- (its input's gradient would be summed twice). chosen: {name, module,
-- style} in module order (so an error names the first module at fault).
local function check_regions(chosen)
  local regions = {}
  for _, c in ipairs(chosen) do
    if c[3] == 'attention' or c[3] == 'region' then regions[c[1]] = true end
  end
  for _, c in ipairs(chosen) do
    local r = regions[c[1]] and ancestor_in(c[1], regions)
    if r then
      fail("%s is '%s' inside the region %s: regions do not nest (the input's gradient would be summed twice)",
        label(c[1]), c[3], label(r))
    end
  end
  return regions
end

-- Under sequence parallelism every colwise/rowwise layer sits in a region
-- (an 'attention' or 'region' module, whose input is gathered), no
-- 'sequence' module does, and every module with parameters of its own
-- between the regions is in the plan: a norm left out would compute on
-- its rows and keep a partial gradient, silently.
local function check_sequence(model, chosen, regions)
  local planned = {}
  for _, c in ipairs(chosen) do planned[c[1]] = true end
  for _, c in ipairs(chosen) do
    local name, s = c[1], c[3]
    local r = ancestor_in(name, regions)
    if (s == 'colwise' or s == 'rowwise') and r == nil then
      fail("sequence_parallel: %s is '%s' outside a region: an enclosing module needs style 'attention' or "
        .. "'region' (its input is gathered along the sequence)", label(name), s)
    end
    if s == 'sequence' and r ~= nil then
      fail("sequence_parallel: %s is 'sequence' inside the region %s, which sees the whole sequence", label(name),
        label(r))
    end
  end
  for _, nm in ipairs(model:named_modules()) do
    local name, m = nm[1], nm[2]
    if next(rawget(m, '_parameters')) ~= nil and not planned[name] and ancestor_in(name, planned) == nil then
      fail("sequence_parallel: %s (%s) holds parameters between the TP regions but is not in the plan: give it "
        .. "style 'sequence' (a norm) or put it inside a region", label(name), m:class_name())
    end
  end
end

-- tp.parallelize(model, plan, {mesh = m} | {group = g}, sequence_parallel =):
-- see the top of this file. Returns the model.
function M.parallelize(model, plan, opts)
  if not nn.Module.is_module(model) then fail('expected a model (an nn.Module), got %s', type(model)) end
  if rawget(model, '_fsdp') then fail('the model is already sharded: call tp.parallelize before fsdp.shard') end
  if rawget(model, '_tp') then fail('the model is already tensor-parallel') end
  check_plan(plan)
  local group = group_of(opts)
  local sp = opts.sequence_parallel
  if sp ~= nil and type(sp) ~= 'boolean' then fail('sequence_parallel must be true or false, got %s', tostring(sp)) end
  local T = group:size()
  local chosen, by_name = {}, {}
  for _, nm in ipairs(model:named_modules()) do
    local name, m = nm[1], nm[2]
    if nn.MoE and m:is_instance_of(nn.MoE) then
      fail('%s is a mixture of experts (%s); TP of experts is not supported yet', name, m:class_name())
    end
    local s = style_of(plan, m, name)
    if s then
      chosen[#chosen + 1] = { name, m, s }
      by_name[name] = s
    end
  end
  if #chosen == 0 then fail('the plan matched no module of %s', model:class_name()) end
  for _, c in ipairs(chosen) do styles.check(c[3], c[2], c[1], T, by_name) end
  local regions = check_regions(chosen)
  if sp then check_sequence(model, chosen, regions) end
  local ctx = { group = group, size = T, rank = group:rank(), done = {}, sp = sp and T > 1,
                in_region = function(name) return ancestor_in(name, regions) ~= nil end }
  for _, c in ipairs(chosen) do styles.apply(c[3], c[2], c[1], ctx) end
  rawset(model, '_tp', { group = group, size = T, rank = group:rank(), styles = by_name,
                         sequence_parallel = sp or false })
  return model
end

-- The TP group of a parallelized model (nil for one that is not).
function M.group(model)
  local s = rawget(model, '_tp')
  return s and s.group
end

-- The gradient norm of a TP model is fsdp.grad_norm's ([Note: the gradient
-- norm under tensor parallelism] in fsdp/sharding/init.lua: a split
-- parameter's squares once per TP rank, a replicated one's 1/T), for a
-- model sharded by fsdp.shard over a mesh or over its data-parallel group.
-- These two are its names here, kept for callers of fsdp.tp.
local function sharded_tp(model, what)
  if not rawget(model, '_tp') then
    core.fail(('tp.%s: the model is not tensor-parallel (tp.parallelize)'):format(what))
  end
  if not rawget(model, '_fsdp') then
    core.fail(('tp.%s: shard the model first (fsdp.shard, a group of one for no data parallelism): '
      .. 'the TP gradient norm is fsdp.%s'):format(what, what))
  end
  return sharding
end

function M.grad_norm(model) return sharded_tp(model, 'grad_norm').grad_norm(model) end

function M.clip_grad_norm(model, max_norm)
  return sharded_tp(model, 'clip_grad_norm').clip_grad_norm(model, max_norm)
end

return M
