-- fsdp.optim.optimizer: the base class of the optimizers: parameter groups
-- chosen by predicates on names, per-parameter state keyed by name, step,
-- zero_grad and state dicts. Subclasses give their defaults and the ranges
-- of their hyper-parameters, and update one parameter with a fused C kernel.
--
--   local opt = optim.AdamW(model:named_parameters(), {
--     lr = 3e-4, betas = {0.9, 0.95}, weight_decay = 0.1,
--     groups = { {match = function(name, p) return p:dim() < 2 end, weight_decay = 0} },
--   })
--
-- `params` is an array of {name, tensor} pairs (named_parameters()), an
-- array of tensors (named '0', '1', ... by position) or a module. Each
-- parameter joins the first group whose `match` accepts it, else the
-- default group; opt.param_groups[1] is the default group and the groups
-- given follow in order (possibly empty, so indices stay stable). Every
-- group carries all hyper-parameters (lr among them, which schedulers set).
-- State is keyed by parameter name, so state dicts speak the model's names.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local factories = require 'fsdp.factories'
local F = require 'fsdp.functional'
local Tensor = require 'fsdp.tensor'
local Module = require 'fsdp.nn.module'
local tables = require 'fsdp.tables'

local Optimizer = {}
Optimizer.__index = Optimizer
Optimizer.name = 'Optimizer'

-- What a subclass calls its fused kernel with: the core's C namespace and
-- a Tensor's fl_tensor pointer (so its header is its own requires only).
Optimizer.C = core.C
Optimizer.cptr = Tensor.cptr

-- A new optimizer class: Optimizer:extend('AdamW', {lr = 1e-3, ...}, ranges).
-- Calling the class builds an instance: AdamW(params, opts). `ranges` is
-- what check_group holds every group to, in order: {key, rule} (a
-- fsdp.validate rule: NaN and infinity pass none, where a comparison would
-- let a NaN lr make every parameter NaN at the first step), or {key, rule,
-- pair = 'text'} for a pair of numbers each under rule ("betas must be
-- <text>" otherwise). A class with checks beyond ranges overrides
-- check_group and calls Optimizer.check_group first.
function Optimizer:extend(name, defaults, ranges)
  local cls = setmetatable({}, {
    __index = self,
    __call = function(c, params, opts) return c.new(c, params, opts) end,
  })
  cls.__index = cls
  cls.name = name
  cls.defaults = defaults
  cls.ranges = ranges or {}
  return cls
end

local function known_keys(defaults) return table.concat(tables.sorted_keys(defaults), ', ') end

-- A copy of v (tables one level deep: betas).
local function copy(v)
  if type(v) ~= 'table' then return v end
  local t = {}
  for k, x in pairs(v) do t[k] = x end
  return t
end

local function normalise_params(self, params)
  if Module.is_module(params) then params = params:named_parameters() end
  if type(params) ~= 'table' then
    core.fail(('%s: params must be named_parameters(), an array of tensors or a module, got %s')
      :format(self.name, type(params)))
  end
  local out, seen = {}, {}
  for i, e in ipairs(params) do
    local name, p
    if Tensor.is_tensor(e) then
      name, p = tostring(i - 1), e
    elseif type(e) == 'table' and type(e[1]) == 'string' and Tensor.is_tensor(e[2]) then
      name, p = e[1], e[2]
    else
      core.fail(('%s: params entry %d is neither a tensor nor a {name, tensor} pair'):format(self.name, i))
    end
    if seen[p] then
      core.fail(('%s: parameter %s is the same tensor as %s; pass each parameter once')
        :format(self.name, name, seen[p]))
    end
    seen[p] = name
    out[#out + 1] = { name, p }
  end
  return out
end

function Optimizer.new(cls, params, opts)
  local self = setmetatable({ state = {}, param_groups = {} }, cls)
  opts = opts or {}
  local defaults = cls.defaults
  local base = {}
  for k, v in pairs(defaults) do base[k] = copy(v) end
  for k, v in pairs(opts) do
    if k ~= 'groups' then
      if defaults[k] == nil then
        core.fail(('%s: unknown option %s (known: groups, %s)'):format(cls.name, k, known_keys(defaults)))
      end
      base[k] = copy(v)
    end
  end
  local specs = opts.groups or {}
  local groups = { base }
  for gi, spec in ipairs(specs) do
    if type(spec) ~= 'table' or type(spec.match) ~= 'function' then
      core.fail(('%s: groups[%d] needs a match = function(name, param) predicate'):format(cls.name, gi))
    end
    local g = {}
    for k, v in pairs(base) do g[k] = copy(v) end
    for k, v in pairs(spec) do
      if k ~= 'match' and k ~= 'name' then
        if defaults[k] == nil then
          core.fail(('%s: groups[%d] has unknown option %s (known: %s)'):format(cls.name, gi, k, known_keys(defaults)))
        end
        g[k] = copy(v)
      end
    end
    g.match, g.name = spec.match, spec.name
    groups[#groups + 1] = g
  end
  for _, g in ipairs(groups) do g.params, g.names = {}, {} end
  for _, np in ipairs(normalise_params(self, params)) do
    local target = groups[1]
    for gi = 2, #groups do
      if groups[gi].match(np[1], np[2]) then target = groups[gi]; break end
    end
    target.params[#target.params + 1] = np[2]
    target.names[#target.names + 1] = np[1]
  end
  for gi, g in ipairs(groups) do
    local bad = self:check_group(g)
    if bad then
      core.fail(('%s: %s%s'):format(cls.name, gi == 1 and '' or ('groups[%d]: '):format(gi - 1), bad))
    end
    self.param_groups[gi] = g
  end
  self:setup()
  return self
end

-- Subclass hooks: prepare per-optimizer scratch (setup), make the state of
-- a parameter at its first update (new_state(g, p): its tensors), update
-- one parameter: update(g, name, p, grad), where p and grad may be views of
-- a sharded unit's buffers that are freed when it returns (keep a clone,
-- not them).
function Optimizer:setup() end
function Optimizer:new_state() return {} end
function Optimizer:update()
  core.fail(self.name .. ' has no update()')
end

-- What is wrong with group g's hyper-parameters under the class's ranges
-- (a message), or nil.
function Optimizer:check_group(g)
  for _, r in ipairs(self.ranges) do
    local key, rule, v = r[1], r[2], g[r[1]]
    if r.pair then
      if type(v) ~= 'table' or validate.problem(v[1], rule) or validate.problem(v[2], rule) then
        return key .. ' must be ' .. r.pair
      end
    else
      local why = validate.problem(v, rule)
      if why then return key .. ' ' .. why end
    end
  end
  return nil
end

-- The state of parameter `name` (step = 0 and new_state's tensors at its
-- first update).
function Optimizer:state_of(g, name, p)
  local st = self.state[name]
  if st == nil then
    st = self:new_state(g, p)
    st.step = 0
    self.state[name] = st
  end
  return st
end

-- Count one update of st and make it with the fused kernel's status rc:
-- a refusal takes the count back and raises the core's message with the
-- optimizer and parameter named.
--   st.step = st.step + 1
--   self:check_update(name, st, C.fl_sgd_step_(...))
function Optimizer:check_update(name, st, rc)
  if rc ~= 0 then
    st.step = st.step - 1
    self:raise(name)
  end
end

-- update_many(g, names, ps, grads): update whole (unsharded) parameters of
-- group g at once; a subclass with a multi-tensor kernel overrides it
-- (AdamW: [Note: multi-tensor updates] in core/cuda/cuda_optim.cu).
function Optimizer:update_many(g, names, ps, grads)
  for i = 1, #ps do self:update(g, names[i], ps[i], grads[i]) end
end

-- Raise the core's last error with the optimizer and parameter named.
function Optimizer:raise(name)
  core.fail(('%s: parameter %s: %s'):format(self.name, name, core.last_error()))
end

-- A zero state tensor shaped like p (dtype: p's unless given).
function Optimizer:zeros_like(p, dtype)
  return factories.zeros(p.shape, { dtype = dtype or p.dtype, device = p.device })
end

-- The gradient of p as a contiguous tensor, or nil.
local function grad_of(p)
  local g = p.grad
  if g == nil then return nil end
  if not g:is_contiguous() then g = g:contiguous() end
  return g
end

-- [Note: fused updates of sharded units]
-- The parameters of a sharded model are segments of one flat shard per
-- unit (fsdp.sharding.unit). Consecutive segments of one unit in one group
-- form a run; a run is updated by one kernel call on the flat shard, its
-- gradient and flat state tensors. Per-name state stays what state_dict
-- and checkpoints see: each name's tensors are views into the run's, and
-- its step count is refreshed after each update. load_state_dict drops the
-- runs; they are rebuilt from the per-name state on the next step, fused
-- only where the names' scalars (step) agree. A segment that is empty on
-- this rank (its parameter lies in other ranks' shards) is in no run and
-- gets no state: nothing of it is updated here, and state kept for it
-- would never be stepped ([Note: optimizer state is saved by the ranks
-- that hold the parameter] in lua/fsdp/checkpointing/optim_state.lua).

-- The runs of group g: {unit=, start=, len=, names={...}, params={...}}.
local function runs_of(g)
  local runs, cur = {}, nil
  for i, p in ipairs(g.params) do
    local u = rawget(p, 'fsdp_unit')
    if u == nil then
      cur = nil -- a whole parameter, updated on its own
    elseif p:numel() > 0 then -- (an empty segment is in no run, and breaks none)
      local start = p:storage_offset() - u.shard:storage_offset()
      if cur and cur.unit == u and cur.start + cur.len == start then
        cur.len = cur.len + p:numel()
      else
        cur = { unit = u, start = start, len = p:numel(), names = {}, params = {} }
        runs[#runs + 1] = cur
      end
      cur.names[#cur.names + 1] = g.names[i]
      cur.params[#cur.params + 1] = p
    end
  end
  return runs
end

-- The non-tensor state of st (step...) as one comparable string.
local function scalars_of(st)
  local out = {}
  for k, v in pairs(st) do
    if not Tensor.is_tensor(v) then
      out[#out + 1] = k .. '=' .. (type(v) == 'number' and ('%.17g'):format(v) or tostring(v))
    end
  end
  table.sort(out)
  return table.concat(out, ',')
end

-- Make the run's state from its names' states (all present with the same
-- scalars: concatenated once), or leave it to the first update (none
-- present). Returns false when the run cannot be fused (the names are
-- then updated one by one, each with its own step).
local function adopt_state(self, run)
  local sts, any, all = {}, false, true
  for i, name in ipairs(run.names) do
    sts[i] = self.state[name]
    if sts[i] then any = true else all = false end
  end
  if not any then return true end
  if not all then return false end
  local first = scalars_of(sts[1])
  for i = 2, #sts do
    if scalars_of(sts[i]) ~= first then return false end
  end
  local st = {}
  for k, v in pairs(sts[1]) do
    if Tensor.is_tensor(v) then
      local parts = {}
      for i = 1, #sts do parts[i] = sts[i][k]:reshape(-1) end
      st[k] = F.cat(parts, 0)
    else
      st[k] = v
    end
  end
  run.state = st
  return true
end

-- Per-name views of the run's state.
local function share_state(self, run)
  local off = 0
  for i, name in ipairs(run.names) do
    local n = run.params[i]:numel()
    local s = {}
    for k, v in pairs(run.state) do
      s[k] = Tensor.is_tensor(v) and v:narrow(0, off, n) or v
    end
    self.state[name] = s
    off = off + n
  end
end

function Optimizer:step_run(g, run)
  local u = run.unit
  if u.grad == nil or run.len == 0 then return end
  if run.state == nil and not run.fresh then
    if not adopt_state(self, run) then -- partial state: per segment
      for i, p in ipairs(run.params) do
        local grad = grad_of(p)
        if grad ~= nil then self:update(g, run.names[i], p, grad) end
      end
      return
    end
    run.fresh = run.state == nil
  end
  local key = run.names[1] .. '#run'
  local p = u.shard:narrow(0, run.start, run.len)
  local grad = u.grad:narrow(0, run.start, run.len)
  self.state[key] = run.state
  local ok, err = pcall(self.update, self, g, key, p, grad)
  -- (views of the unit's buffers, freed now: left to the collector they
  -- would pin a gradient the next zero_grad drops)
  p:free()
  grad:free()
  run.state, self.state[key] = self.state[key], nil
  if not ok then error(err, 0) end
  run.fresh = false
  share_state(self, run)
end

-- One update of every parameter that has a gradient (others are skipped,
-- their state untouched, as in PyTorch).
function Optimizer:step()
  if self.runs == nil then
    self.runs = {}
    for gi, g in ipairs(self.param_groups) do self.runs[gi] = runs_of(g) end
  end
  for gi, g in ipairs(self.param_groups) do
    local params, names = g.params, g.names
    local ns, ps, gs = {}, {}, {}
    for i = 1, #params do
      if rawget(params[i], 'fsdp_unit') == nil then
        local grad = grad_of(params[i])
        if grad ~= nil then ns[#ns + 1], ps[#ps + 1], gs[#gs + 1] = names[i], params[i], grad end
      end
    end
    if #ps > 0 then self:update_many(g, ns, ps, gs) end
    for _, run in ipairs(self.runs[gi]) do self:step_run(g, run) end
  end
end

-- Drop every parameter's gradient (PyTorch's set_to_none=True).
function Optimizer:zero_grad()
  for _, g in ipairs(self.param_groups) do
    for _, p in ipairs(g.params) do p.grad = nil end
  end
end

-- The learning rate of each group, in order.
function Optimizer:get_lrs()
  local out = {}
  for i, g in ipairs(self.param_groups) do out[i] = g.lr end
  return out
end

-- {state = {[name] = {step=, <tensors>...}}, param_groups = {{<hyper-
-- parameters>, names = {...}}}}. Tensors are the optimizer's own (not
-- copies), as in PyTorch.
function Optimizer:state_dict()
  local groups = {}
  for i, g in ipairs(self.param_groups) do
    local h = {}
    for k in pairs(self.defaults) do h[k] = copy(g[k]) end
    if g.initial_lr then h.initial_lr = g.initial_lr end
    h.names = copy(g.names)
    groups[i] = h
  end
  local state = {}
  for name, st in pairs(self.state) do
    local s = {}
    for k, v in pairs(st) do s[k] = v end
    state[name] = s
  end
  return { state = state, param_groups = groups }
end

-- Restore hyper-parameters and state saved by state_dict(). The groups
-- must hold the same parameter names; state tensors are copied to each
-- parameter's device.
function Optimizer:load_state_dict(sd)
  if type(sd) ~= 'table' or type(sd.param_groups) ~= 'table' or type(sd.state) ~= 'table' then
    core.fail(self.name .. ': load_state_dict expects {state=, param_groups=}')
  end
  if #sd.param_groups ~= #self.param_groups then
    core.fail(('%s: load_state_dict: the state has %d parameter groups, this optimizer %d')
      :format(self.name, #sd.param_groups, #self.param_groups))
  end
  local by_name = {}
  for gi, g in ipairs(self.param_groups) do
    local saved = sd.param_groups[gi]
    local names = saved.names or {}
    if #names ~= #g.names then
      core.fail(('%s: load_state_dict: group %d has %d parameters in the state, %d here')
        :format(self.name, gi, #names, #g.names))
    end
    for i, n in ipairs(g.names) do
      if names[i] ~= n then
        core.fail(('%s: load_state_dict: group %d parameter %d is %s in the state but %s here')
          :format(self.name, gi, i, tostring(names[i]), n))
      end
      by_name[n] = g.params[i]
    end
  end
  for name, st in pairs(sd.state) do
    if by_name[name] == nil then
      core.fail(('%s: load_state_dict: state for unknown parameter %s'):format(self.name, name))
    end
  end
  for gi, g in ipairs(self.param_groups) do
    for k in pairs(self.defaults) do
      if sd.param_groups[gi][k] ~= nil then g[k] = copy(sd.param_groups[gi][k]) end
    end
    g.initial_lr = sd.param_groups[gi].initial_lr or g.initial_lr
  end
  local state = {}
  for name, st in pairs(sd.state) do
    local p, s = by_name[name], {}
    for k, v in pairs(st) do
      if Tensor.is_tensor(v) then s[k] = v:to({ device = p.device }):clone() else s[k] = v end
    end
    state[name] = s
  end
  self.state = state
  self.runs = nil -- see [Note: fused updates of sharded units]
end

return Optimizer
