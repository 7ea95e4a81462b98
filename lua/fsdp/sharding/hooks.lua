-- fsdp.sharding.hooks: the orchestration of a sharded model's units
-- during a step, as one State per model: gathering before forward (and
-- prefetching the next unit in the recorded order), freeing after it,
-- gathering again before backward, reducing gradients after it, and the
-- callback that waits for the last reductions at the end of backward.
-- fsdp.shard (init.lua) makes the State and installs these as module hooks
-- and autograd nodes.
local autograd = require 'fsdp.autograd'
local Tensor = require 'fsdp.tensor'
local spans = require 'fsdp.spans' -- the profiler (fsdp.observe) subscribes

local State = {}
State.__index = State

function State:start_unshard(u)
  if u == nil or not u:needs_unshard() then return end
  if self.limit_all_gathers then
    while #self.inflight >= 2 do table.remove(self.inflight, 1):wait() end
  end
  u:unshard()
  self.inflight[#self.inflight + 1] = u
end

function State:ensure_unsharded(u)
  self:start_unshard(u)
  u:wait()
  for i, v in ipairs(self.inflight) do
    if v == u then table.remove(self.inflight, i); break end
  end
end

local function next_map(order)
  local nxt = {}
  for i = 1, #order - 1 do nxt[order[i]] = order[i + 1] end
  return nxt
end

-- Floating-point tensors of packed args in dtype, in place (the root's
-- cast is also what fsdp.plan's trace does to the example batch).
local function cast_inputs(args, dtype)
  for i = 1, args.n do
    local a = args[i]
    if Tensor.is_tensor(a) and a:is_floating_point() and a.dtype ~= dtype then
      args[i] = a:to({ dtype = dtype })
    end
  end
  return args
end

function State:pre_forward(u, ...)
  if self.summoned then return ... end -- whole parameters are bound already
  local grad = autograd.is_grad_enabled()
  if u.is_root and grad then
    self.iteration = self.iteration + 1
    for _, v in ipairs(self.units) do v.inputs_pending = 0 end
  end
  if grad and self.recording_forward then self.fwd_order[#self.fwd_order + 1] = u end
  self:ensure_unsharded(u)
  if self.forward_prefetch and self.fwd_next then self:start_unshard(self.fwd_next[u]) end
  u:bind_views(function(unit, grads) self:post_backward(unit, grads) end)
  -- Floating-point inputs take the unit's compute dtype (FSDP's
  -- cast_forward_inputs), so units of different precisions compose.
  local args = cast_inputs(autograd.pack(...), u.param_dtype)
  if grad and u.frozen and not u.is_root then args = self:watch_inputs(u, args) end
  return unpack(args, 1, args.n)
end

-- [Note: frozen parameters] A unit with trainable parameters frees its
-- frozen partner with itself at its post-backward: that node was created
-- before every op of the unit's forward, and the engine runs ready nodes
-- in decreasing creation order (core/autograd/engine.c), so when it runs,
-- every op of the unit that backward reaches has run, those that only use
-- the frozen weights included. A unit whose parameters are all frozen has
-- no post-backward node; as FSDP2 does, a node on the forward's inputs
-- that require grad, created before the unit's ops as well, tells when its
-- backward is over (after every call of a forward, counted). Inputs that
-- require no grad leave nothing of the unit to backpropagate.
function State:watch_inputs(u, args)
  local new, attached = autograd.on_gradient('FSDPInputsBackward[' .. u:label() .. ']', args, function(grads)
    u.inputs_pending = u.inputs_pending - 1
    if u.inputs_pending == 0 and u:state() == 'UNSHARDED' then
      u:reshard()
      u:bind_segments()
    end
    return grads
  end)
  if attached then u.inputs_pending = (u.inputs_pending or 0) + 1 end
  return new
end

-- Free u (and its frozen partner) and give the slots their segments back.
local function rest(u)
  u:reshard()
  u:bind_segments()
  if u.partner then
    u.partner:reshard()
    u.partner:bind_segments()
  end
end

function State:post_forward(u, out)
  if self.summoned then return nil end
  if not autograd.is_grad_enabled() then
    rest(u)
    return nil
  end
  if u.is_root and self.recording_forward then
    self.recording_forward = false
    self.fwd_next = next_map(self.fwd_order)
  end
  if u.reshard_after_forward and not u.is_root then
    u:reshard()
    if u.partner then u.partner:reshard() end
  end
  local new, attached = autograd.on_gradient('FSDPPreBackward[' .. u:label() .. ']', out, function(grads)
    self:pre_backward(u)
    return grads
  end)
  return attached and new or nil
end

function State:pre_backward(u)
  -- a unit's backward span (fsdp.profiler): from here to its post_backward
  if spans.on then u.backward_t0 = spans.now() end
  if not self.callback_queued then
    self.callback_queued = true
    autograd.queue_callback(function() self:finish_backward() end)
  end
  if self.recording_backward then self.bwd_order[#self.bwd_order + 1] = u end
  self:ensure_unsharded(u)
  if self.backward_prefetch == 'pre' and self.bwd_next then self:start_unshard(self.bwd_next[u]) end
end

function State:post_backward(u, grads)
  u:reduce_grads(grads, self.sync)
  -- Packed (copied) now: their handles are this node's alone, and left to
  -- the collector they would keep the unit's parameter gradients through
  -- the C nodes that run next (the stem's embedding backward), over what
  -- fsdp.plan counts.
  for i = 1, #u.params do
    if grads[i] ~= nil then grads[i]:free() end
  end
  if self.sync then
    -- At most one reduction in flight besides this one: it overlaps the
    -- next unit's backward, and packed gradients do not pile up.
    for _, v in ipairs(self.pending) do v:finish_reduce() end
    self.pending = { u }
  end
  rest(u)
  if self.backward_prefetch == 'post' and self.bwd_next then self:start_unshard(self.bwd_next[u]) end
  if spans.on and u.backward_t0 then
    spans.span('backward ' .. u:label(), 'backward', u.backward_t0)
    u.backward_t0 = nil
  end
end

function State:finish_backward()
  self.callback_queued = false
  for _, v in ipairs(self.pending) do v:finish_reduce() end
  self.pending = {}
  if self.recording_backward then
    self.recording_backward = false
    self.bwd_next = next_map(self.bwd_order)
  end
  -- Units whose gradients never came (unused in this forward) and
  -- prefetches nobody used: back to rest.
  for _, u in ipairs(self.inflight) do u:wait() end
  self.inflight = {}
  for _, u in ipairs(self.units) do
    if u:state() ~= 'SHARDED' then u:reshard() end
    u:bind_segments()
    u.inputs_pending = 0
  end
end

State.cast_inputs = cast_inputs

return State
