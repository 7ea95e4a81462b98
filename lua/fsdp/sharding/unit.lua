-- fsdp.sharding.unit: one sharded unit as the training loop sees it: the C
-- flat parameter (core/sharding/unit.c) plus what ties it to a module: the
-- parameter slots it rebinds, the per-parameter shard segments the
-- optimizer updates, and the autograd nodes that gather before backward
-- and reduce after it.
--
-- [Note: what a parameter slot holds]
-- At rest (outside forward and backward) every slot of a sharded parameter
-- (module._parameters[key], for every module sharing the tensor) holds its
-- *segment*: a 1-d leaf viewing the part of the parameter in this rank's
-- master shard (maybe empty), with the original name, init rule and a
-- .grad viewing the sharded gradient. model:named_parameters(), the
-- optimizers, zero_grad and state dicts therefore see original names and
-- sharded storage, as FSDP's use_orig_params. Between a unit's pre-forward
-- and its post-backward the slots hold *views* of the gathered parameters
-- in the param dtype, outputs of one Lua autograd node per forward call
-- (FSDPPostBackward); that node runs once every view's gradient is
-- complete, which is exactly when the unit's gradient can be reduced.
--
-- [Note: frozen parameters]
-- Parameters that do not require grad (a LoRA base, fsdp.lora) never share
-- a flat parameter with trainable ones: fsdp.shard gives each wrapped
-- module a second, *frozen* unit for them (`frozen = true`; the trainable
-- unit points at it as `partner`, the one the hooks drive). A frozen unit
-- has no gradient, reduce-scatter or post-backward node, its segments do
-- not require grad (so optimizers and checkpoints skip them), and its
-- master dtype may be its own (a bf16 base under an f32 adapter): its
-- shard is gathered in the unit's compute dtype. It is gathered with its
-- partner and freed with it; a unit whose parameters are all frozen is
-- freed after backward reached its inputs (the same Note in
-- fsdp/sharding/hooks.lua says why both are safe).
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local autograd = require 'fsdp.autograd'
local parameter = require 'fsdp.nn.parameter'
local spans = require 'fsdp.spans' -- the profiler (fsdp.observe) subscribes
local ffi, C = core.ffi, core.C

local Unit = {}
Unit.__index = Unit

local out1, out2, out3 = ffi.new('int64_t[1]'), ffi.new('int64_t[1]'), ffi.new('int64_t[1]')

-- spec: {name=, module=, params = {{name=, tensor=, slots={{tbl, key}...}}...},
--        shard_group=, replicate_group= (fsdp.dist Groups or nil), strategy=,
--        reshard_after_forward=, master/param/reduce dtypes, device, cpu_offload,
--        is_root}
function Unit.new(spec)
  local self = setmetatable({}, Unit)
  for k, v in pairs(spec) do self[k] = v end
  local n = #spec.params
  local names = ffi.new('const char*[?]', math.max(n, 1))
  local ndims = ffi.new('int[?]', math.max(n, 1))
  local total = 0
  for _, p in ipairs(spec.params) do total = total + #p.tensor.shape end
  local dims = ffi.new('int64_t[?]', math.max(total, 1))
  local keep, k = {}, 0
  for i, p in ipairs(spec.params) do
    keep[i] = p.name
    names[i - 1] = p.name
    local shape = p.tensor.shape
    ndims[i - 1] = #shape
    for _, s in ipairs(shape) do dims[k] = s; k = k + 1 end
    p.shape, p.numel = shape, p.tensor:numel()
  end
  local cfg = ffi.new('fl_unit_config')
  cfg.shard_group = spec.shard_group and spec.shard_group._c or nil
  cfg.replicate_group = spec.replicate_group and spec.replicate_group._c or nil
  cfg.master_dtype = core.dtype(spec.master_dtype)
  cfg.param_dtype = core.dtype(spec.param_dtype)
  cfg.reduce_dtype = core.dtype(spec.reduce_dtype)
  cfg.grad_dtype = core.dtype(spec.grad_dtype or spec.master_dtype)
  cfg.device = core.device(spec.device)
  cfg.cpu_offload = spec.cpu_offload and true or false
  local c = C.fl_unit_new(spec.name, n, names, ndims, dims, cfg)
  if c == nil then core.raise() end
  self.c = ffi.gc(c, C.fl_unit_free)
  self.shard = Tensor.wrap(C.fl_unit_shard(c))
  self.numel = tonumber(C.fl_unit_numel(c))
  self.padded_numel = tonumber(C.fl_unit_padded_numel(c))
  self.shard_numel = tonumber(C.fl_unit_shard_numel(c))
  self.gathered_bytes = tonumber(C.fl_unit_gathered_bytes(c))
  -- An input for the post-backward node, so it is recorded: the node
  -- returns no gradient for it (meta: it costs no memory).
  self.anchor = Tensor.wrap(C.fl_empty(0, nil, core.dtype('f32'), core.device('meta')))
  self.anchor:requires_grad_(true)
  for i, p in ipairs(self.params) do
    core.check(C.fl_unit_param_shard_range(c, i - 1, out1, out2, out3))
    p.param_start, p.shard_start, p.len = tonumber(out1[0]), tonumber(out2[0]), tonumber(out3[0])
    p.offset = tonumber(C.fl_unit_param_offset(c, i - 1))
  end
  self:make_segments()
  return self
end

function Unit:label() return self.name == '' and '<root>' or self.name end

function Unit:state()
  local s = C.fl_unit_state_of(self.c)
  return s == C.FL_UNIT_SHARDED and 'SHARDED' or s == C.FL_UNIT_UNSHARDING and 'UNSHARDING' or 'UNSHARDED'
end

-- segments -------------------------------------------------------------------------

-- The segment of each parameter: shard[shard_start, +len) as a leaf that
-- requires grad, carrying the parameter's Lua fields (init rule...).
function Unit:make_segments()
  autograd.no_grad(function()
    for _, p in ipairs(self.params) do
      local seg = self.shard:narrow(0, p.shard_start, p.len)
      for key, v in pairs(p.tensor) do
        if type(key) == 'string' and key:sub(1, 1) ~= '_' and rawget(seg, key) == nil then rawset(seg, key, v) end
      end
      rawset(seg, 'is_param', true)
      rawset(seg, 'fsdp_unit', self)
      rawset(seg, 'fsdp_shape', p.shape)
      rawset(seg, 'fsdp_offset', p.param_start) -- its first element in the whole parameter
      if self.shard:is_floating_point() and not self.frozen then seg:requires_grad_(true) end
      p.segment = seg
    end
  end)
end

-- Fill this rank's shard: from the init rules (keyed by the parameter's
-- name and element index, so the values are those of a one-rank init of
-- the whole model), or from the values the parameter already has. With
-- rules false, parameters without values (meta) are zeros: their values
-- are loaded next; rules may also be a predicate on the parameter's name
-- (true: draw its rule), for a load that brings only some of them (a
-- pretrained base under new LoRA adapters).
function Unit:init_shard(seed, rules)
  autograd.no_grad(function()
    for _, p in ipairs(self.params) do
      if p.len > 0 then
        local rule = rawget(p.tensor, 'init')
        local draw = rules ~= false and (type(rules) ~= 'function' or rules(p.name))
        if (p.tensor:is_meta() or p.tensor:is_fake()) and not draw then
          p.segment:fill_(0)
        elseif p.tensor:is_meta() or p.tensor:is_fake() then
          if rule == nil then
            core.fail(('fsdp.shard: parameter %s is on the meta device and has no init rule'):format(p.name))
          end
          parameter.fill(p.segment, rule, { seed = seed, name = p.name, offset = p.param_start },
                         'parameter ' .. p.name)
        else
          p.segment:copy_(p.tensor:reshape(-1):narrow(0, p.param_start, p.len))
        end
      end
    end
  end)
end

-- Bind every slot of every parameter to value(p).
local function bind(self, value)
  for _, p in ipairs(self.params) do
    local v = value(p)
    for _, slot in ipairs(p.slots) do slot[1][slot[2]] = v end
  end
end

function Unit:bind_segments() bind(self, function(p) return p.segment end) end

-- gradients --------------------------------------------------------------------------

-- Point the segments' .grad at the unit's sharded gradient (after it was
-- created or replaced).
function Unit:bind_grads()
  local g = C.fl_unit_grad(self.c)
  if g == nil then return end
  g = Tensor.wrap(g)
  for _, p in ipairs(self.params) do
    p.segment.grad = g:narrow(0, p.shard_start, p.len)
  end
  self.grad = g
end

-- The segments' gradients were dropped (optimizer:zero_grad(),
-- model:zero_grad()): the next reduce starts the sharded gradient afresh.
-- Its memory goes now, before the new gradient is packed, as fsdp.plan
-- assumes: the views zero_grad dropped are garbage until the collector
-- runs, and while they pin the old gradient the unit's packing holds it
-- twice (the small Llama's root unit in bf16: 125 MiB over the plan's
-- peak). So when they still hold it, one full collection frees them; the
-- first unit to drop in a step frees every unit's (all went garbage at
-- once), so the others find their gradient released at once.
function Unit:sync_zero_grad()
  local seg = self.params[1] and self.params[1].segment
  if self.grad ~= nil and seg ~= nil and seg.grad == nil then
    self.grad:free()
    self.grad = nil
    if not C.fl_unit_zero_grad(self.c) then Tensor.full_collection() end
  end
end

-- The reduced gradient is in: bind it.
function Unit:finish_reduce()
  if not C.fl_unit_reduce_pending(self.c) then return end
  local t0 = spans.on and spans.now()
  core.check(C.fl_unit_finish_reduce(self.c))
  if t0 then spans.span('wait reduce-scatter ' .. self:label(), 'wait', t0) end
  self:bind_grads()
end

-- gathering --------------------------------------------------------------------------

-- A frozen partner is gathered along with its unit; it is freed on its
-- own ([Note: frozen parameters]). With a trace being recorded
-- (fsdp.profiler) each is a span: the all-gather's start, the wait for
-- it (the communication compute did not hide), the free.
local function unshard(self)
  core.check(C.fl_unit_unshard(self.c))
  if self.partner then core.check(C.fl_unit_unshard(self.partner.c)) end
end
local function wait(self)
  core.check(C.fl_unit_wait(self.c))
  local f = self.partner
  if f then
    -- (A unit of one rank in its own dtype is never resharded, its shard
    -- being its whole parameter, while a bf16 partner is.)
    if f:state() == 'SHARDED' then core.check(C.fl_unit_unshard(f.c)) end
    core.check(C.fl_unit_wait(f.c))
  end
end
function Unit:unshard()
  if not spans.on then return unshard(self) end
  local t0 = spans.now()
  unshard(self)
  local bytes = tonumber(C.fl_unit_gathered_bytes(self.c))
  if self.partner then bytes = bytes + tonumber(C.fl_unit_gathered_bytes(self.partner.c)) end
  spans.span('all-gather ' .. self:label(), 'comm', t0, { bytes = bytes })
end
function Unit:wait()
  if not spans.on then return wait(self) end
  local t0 = spans.now()
  wait(self)
  spans.span('wait all-gather ' .. self:label(), 'wait', t0)
end

-- Whether unshard() has anything to start (this unit or its partner).
function Unit:needs_unshard()
  return self:state() == 'SHARDED' or (self.partner ~= nil and self.partner:state() == 'SHARDED')
end
function Unit:reshard()
  if not spans.on then return core.check(C.fl_unit_reshard(self.c)) end
  local t0 = spans.now()
  core.check(C.fl_unit_reshard(self.c))
  spans.span('reshard ' .. self:label(), 'comm', t0)
end

-- Views of the gathered parameters, made outputs of a post-backward node
-- when gradients are recorded (on_grads(unit, grads) runs when they are
-- complete), and bound into the slots.
function Unit:bind_views(on_grads)
  local views = {}
  for i = 1, #self.params do views[i] = Tensor.wrap(C.fl_unit_param_view(self.c, i - 1)) end
  if autograd.is_grad_enabled() and self.shard:is_floating_point() and not self.frozen then
    autograd.attach('FSDPPostBackward[' .. self:label() .. ']', { self.anchor }, views, function(grads)
      on_grads(self, grads)
      return {}
    end)
  end
  local by = {}
  for i, p in ipairs(self.params) do by[p] = views[i] end
  bind(self, function(p) return by[p] end)
  self.views = views
  if self.partner then self.partner:bind_views() end
end

-- Pack this backward's gradients (plus what no_sync accumulated) and start
-- reducing them, or with sync == false only accumulate them unsharded.
function Unit:reduce_grads(grads, sync)
  -- A gradient the user dropped (zero_grad) goes before the reduced one is
  -- packed (held until the reduce, it and the packed buffer were both
  -- alive: the small Llama's root unit in bf16 held 125 MiB more than
  -- fsdp.plan's peak); no_sync's backwards leave it to the last.
  if sync then self:sync_zero_grad() end
  local n = #self.params
  local arr = ffi.new('fl_tensor*[?]', math.max(n, 1))
  for i = 1, n do arr[i - 1] = grads[i] and Tensor.cptr(grads[i]) or nil end
  local extra = self.accumulated and Tensor.cptr(self.accumulated) or nil
  local flat = C.fl_unit_pack_grads(self.c, n, arr, extra)
  if flat == nil then core.raise() end
  flat = Tensor.wrap(flat)
  if not sync then
    self.accumulated = flat
    return
  end
  self.accumulated = nil
  local t0 = spans.on and spans.now()
  core.check(C.fl_unit_reduce(self.c, Tensor.cptr(flat)))
  if t0 then
    spans.span('reduce-scatter ' .. self:label(), 'comm', t0, { bytes = flat:numel() * flat:element_size() })
  end
end

-- Whole parameters in the master dtype, gathered from every shard:
-- {[param] = tensor shaped like it}.
function Unit:gather_full()
  local full = C.fl_unit_gather_master(self.c, core.dtype(self.master_dtype))
  if full == nil then core.raise() end
  full = Tensor.wrap(full)
  local out = {}
  for _, p in ipairs(self.params) do
    -- The intermediate narrow is released now: left to the collector it
    -- would pin the whole gathered buffer after the caller frees the rest.
    local flat = full:narrow(0, p.offset, p.numel)
    out[p] = flat:view(p.shape)
    flat:free()
  end
  return out, full
end

function Unit:scatter_full(full)
  core.check(C.fl_unit_scatter_master(self.c, Tensor.cptr(full)))
end

-- bytes of this rank's sharded state
function Unit:shard_bytes() return self.shard:numel() * self.shard:element_size() end
function Unit:grad_bytes() return self.grad and self.grad:numel() * self.grad:element_size() or 0 end

return Unit
