-- fsdp.autograd: backward from Lua, grad mode, and nodes whose backward is
-- a Lua function (activation checkpointing, the sharding layer's hooks).
--
-- The tape and its kernels are C (core/autograd). The C engine never calls
-- into Lua: when it reaches a Lua node it pauses and returns the node's
-- output gradients here; we run the node's Lua backward and hand the input
-- gradients back (fl_engine_provide). This avoids C->Lua callbacks, which
-- LuaJIT's JIT handles poorly, and lets Lua backward run more ops, even a
-- nested backward (checkpointing does exactly that).
local core = require 'fsdp.core'
local Tensor = require 'fsdp.tensor'
local random = require 'fsdp.random'
local ffi, C = core.ffi, core.C

local M = {}

-- grad mode ---------------------------------------------------------------------

-- Whether ops record the autograd graph now (true unless inside
-- fsdp.no_grad or after fsdp.set_grad_enabled(false)).
function M.is_grad_enabled() return C.fl_grad_enabled() end
-- fsdp.set_grad_enabled(on): turn recording of the autograd graph on or
-- off; returns the previous setting.
function M.set_grad_enabled(on) return C.fl_set_grad_enabled(on and true or false) end

-- LuaJIT lacks table.pack: capture varargs with their count.
local function pack(...) return { n = select('#', ...), ... } end

-- Run fn(...) with grad mode set to `on`, restoring it even on error.
local function with_grad_mode(on, fn, ...)
  local was = C.fl_set_grad_enabled(on)
  local res = pack(pcall(fn, ...))
  C.fl_set_grad_enabled(was)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

-- fsdp.no_grad(fn, ...): fn(...) with the autograd graph not recorded
-- (as torch.no_grad), the previous mode restored even on error; returns
-- fn's results.
function M.no_grad(fn, ...) return with_grad_mode(false, fn, ...) end
-- fsdp.enable_grad(fn, ...): fn(...) with the autograd graph recorded, also
-- inside fsdp.no_grad; returns fn's results.
function M.enable_grad(fn, ...) return with_grad_mode(true, fn, ...) end

-- Lua nodes ------------------------------------------------------------------------

-- id -> {backward = fn(grads) -> input grads, n_inputs = n}
local handlers = {}
local released = ffi.new('int64_t[256]')

-- Node ids are unique in the process, not in this module: the core's list
-- of released ids is one for the process, and this module can be loaded
-- more than once in it (busted reloads modules for each spec file). With
-- ids counted per load, one load would drain another's released id 1 and
-- drop its own live node 1's handler. The Lua registry holds the counter.
local registry = debug.getregistry()
local function new_id()
  local id = registry.fsdp_lua_node_next_id or 1
  registry.fsdp_lua_node_next_id = id + 1
  return id
end

-- Forget handlers of nodes the core freed without running (graphs dropped
-- before backward, e.g. an evaluation pass left in grad mode).
local function collect_released()
  while true do
    local n = C.fl_lua_nodes_released(released, 256)
    for i = 0, n - 1 do handlers[tonumber(released[i])] = nil end
    if n < 256 then return end
  end
end

-- Make `outputs` (tensors with no grad_fn) the outputs of a node whose
-- backward is backward(grads) -> grads for `inputs` (one per input; nil
-- for none). Returns the node id, or nil when nothing requires grad.
function M.attach(name, inputs, outputs, backward)
  collect_released()
  local id = new_id()
  local ins = ffi.new('fl_tensor*[?]', math.max(#inputs, 1))
  for i, t in ipairs(inputs) do ins[i - 1] = Tensor.cptr(t) end
  local outs = ffi.new('fl_tensor*[?]', math.max(#outputs, 1))
  for i, t in ipairs(outputs) do outs[i - 1] = Tensor.cptr(t) end
  core.check(C.fl_lua_node_attach(id, name, #inputs, ins, #outputs, outs))
  if outputs[1] and outputs[1]._c.grad_fn ~= nil then
    handlers[id] = { backward = backward, n_inputs = #inputs, name = name }
    return id
  end
  return nil
end

-- backward --------------------------------------------------------------------------

local event = ffi.new('fl_engine_event')

local function run_lua_node(engine, ev, retain)
  local id = tonumber(ev.lua_id)
  local h = handlers[id]
  -- The handler is the Lua node's saved state: kept for a later backward
  -- only when the graph is retained (the engine refuses spent nodes).
  if not retain then handlers[id] = nil end
  if not h then core.fail(('backward: no Lua handler for node %d'):format(id)) end
  local grads = {}
  for i = 0, ev.n_grads - 1 do
    -- The engine owns these: take our own reference.
    grads[i + 1] = ev.grads[i] ~= nil and Tensor.wrap(C.fl_tensor_retain(ev.grads[i])) or nil
  end
  local ok, result = pcall(h.backward, grads)
  if not ok then
    error(('in backward of %s: %s'):format(h.name, tostring(result)), 0)
  end
  result = result or {}
  local arr = ffi.new('fl_tensor*[?]', math.max(h.n_inputs, 1))
  for i = 1, h.n_inputs do
    arr[i - 1] = result[i] and Tensor.cptr(result[i]) or nil
  end
  core.check(C.fl_engine_provide(engine, h.n_inputs, arr))
end

-- Functions to run once the outermost backward in progress has finished
-- (the sharding layer waits for its last gradient reductions there), in
-- the order queued. Nested backwards (a checkpoint's recompute) do not run
-- them.
local depth, callbacks = 0, {}

-- Whether a backward is running (a checkpoint's recompute runs inside one).
function M.in_backward() return depth > 0 end

-- Run fn() once the running backward has finished (an error outside a
-- backward).
function M.queue_callback(fn)
  if depth == 0 then core.fail('queue_callback: no backward is running') end
  callbacks[#callbacks + 1] = fn
end

local function run_engine(tensors, grads, opts)
  if Tensor.is_tensor(tensors) then tensors, grads = { tensors }, { grads } end
  local retain = opts and opts.retain_graph and true or false
  grads = grads or {}
  local n = #tensors
  local roots = ffi.new('fl_tensor*[?]', math.max(n, 1))
  local gs = ffi.new('fl_tensor*[?]', math.max(n, 1))
  for i = 1, n do
    roots[i - 1] = Tensor.cptr(tensors[i])
    gs[i - 1] = grads[i] and Tensor.cptr(grads[i]) or nil
  end
  local engine = C.fl_engine_start(n, roots, gs)
  if engine == nil then core.raise() end
  engine = ffi.gc(engine, C.fl_engine_free)
  core.check(C.fl_engine_retain_graph(engine, retain))
  while true do
    core.check(C.fl_engine_step(engine, event))
    if event.kind == C.FL_ENGINE_DONE then break end
    run_lua_node(engine, event, retain)
  end
  C.fl_engine_free(ffi.gc(engine, nil))
end

-- Backpropagate from tensors (one Tensor or an array) with optional output
-- gradients (same layout; nil means ones for a scalar). opts.retain_graph:
-- keep the saved tensors so the graph can be backpropagated again; without
-- it a second backward through the graph is an error (as in PyTorch).
function M.backward(tensors, grads, opts)
  if opts ~= nil and type(opts) ~= 'table' then
    core.fail(('backward: options must be a table like {retain_graph = true}, got %s'):format(type(opts)))
  end
  for k in pairs(opts or {}) do
    if k ~= 'retain_graph' then core.fail(('backward: unknown option %s (known: retain_graph)'):format(tostring(k))) end
  end
  depth = depth + 1
  local ok, err = pcall(run_engine, tensors, grads, opts)
  depth = depth - 1
  if depth > 0 then
    if not ok then error(err, 0) end
    return
  end
  local queued = callbacks
  callbacks = {}
  if not ok then error(err, 0) end
  for _, fn in ipairs(queued) do fn() end
end

-- activation checkpointing ----------------------------------------------------------------

-- Inside an offload scope: a packed host copy of each tensor input the
-- core would offload ({[i] = {handle, requires_grad}}), with inputs[i]
-- dropped so the device memory can go; nil when nothing was packed.
local function offload_inputs(inputs)
  if C.fl_offload_depth() == 0 then return nil end
  local packed, out = nil, ffi.new('fl_packed*[1]')
  for i = 1, inputs.n do
    local x = inputs[i]
    if Tensor.is_tensor(x) then
      core.check(C.fl_offload_pack(Tensor.cptr(x), out))
      if out[0] ~= nil then
        packed = packed or {}
        packed[i] = { ffi.gc(out[0], C.fl_packed_release), x.requires_grad }
        inputs[i] = false
      end
    end
  end
  return packed
end

-- The input back on its device as a leaf requiring grad as the original did:
-- a fresh alias each time (the restored tensor is shared by every unpack of
-- the entry, and two recomputes must not add into one .grad).
local function unpack_input(p)
  local t = Tensor.wrap(C.fl_offload_unpack(p[1])):detach()
  if p[2] then t:requires_grad_(true) end
  return t
end

-- Run fn(inputs...) keeping only its inputs: the forward runs without
-- recording; in backward fn runs again with grad on (same random numbers:
-- the global generator is replayed) and its graph is backpropagated at
-- once. `params` lists the parameters fn uses: the node depends on them
-- too, so it is recorded (and their gradients computed) even when no input
-- requires grad, e.g. a first block fed raw data. Two forms:
--   {p1, p2, ...}           fn reads these tensors (leaves): the nested
--                           backward accumulates their .grad directly;
--   {tensors = {...}, swap = function(map) ... return restore end}
--                           fn reads parameters through modules: during the
--                           recompute swap(map) rebinds each tensor t to
--                           map[t], a detached copy, and returns a function
--                           undoing it; the copies' gradients are returned
--                           to the outer backward as this node's. Parameters
--                           that are themselves computed (the sharding
--                           layer's views of gathered units) need this form:
--                           their gradients must flow back through the
--                           outer graph, not stop at a nested one.
-- Returns fn's outputs.
function M.checkpoint_with_params(params, fn, ...)
  local inputs = pack(...)
  local rng_state = random.get_state()
  local outputs = pack(M.no_grad(fn, unpack(inputs, 1, inputs.n)))
  local swap = params.swap
  local ptensors = swap and params.tensors or params
  local tensor_inputs = {}
  for i = 1, inputs.n do
    if Tensor.is_tensor(inputs[i]) then tensor_inputs[#tensor_inputs + 1] = inputs[i] end
  end
  local n_data = #tensor_inputs
  for _, p in ipairs(ptensors) do tensor_inputs[#tensor_inputs + 1] = p end
  -- Inside an offload scope (fsdp.offload_activations) the kept inputs go
  -- to pinned CPU memory: packed[i] replaces inputs[i] until the recompute.
  local packed = offload_inputs(inputs)
  -- Outputs leave the forward as fresh detached tensors; the Lua node makes
  -- them depend on the inputs.
  local outs = {}
  for i = 1, outputs.n do
    if Tensor.is_tensor(outputs[i]) then
      outputs[i] = outputs[i]:detach()
      outs[#outs + 1] = outputs[i]
    end
  end
  local function leaf_like(x)
    local d = x:detach()
    if x.requires_grad then d:requires_grad_(true) end
    return d
  end
  M.attach('CheckpointBackward', tensor_inputs, outs, function(grads)
    -- Recompute with grad on, from detached copies of the inputs that
    -- require grad exactly when the originals do.
    local again, leaves = {}, {}
    for i = 1, inputs.n do
      local x = inputs[i]
      if packed and packed[i] then
        again[i] = unpack_input(packed[i])
        leaves[#leaves + 1] = again[i]
      elseif Tensor.is_tensor(x) then
        again[i] = leaf_like(x)
        leaves[#leaves + 1] = again[i]
      else
        again[i] = x
      end
    end
    local copies, restore = {}, nil
    if swap then
      for _, p in ipairs(ptensors) do copies[p] = leaf_like(p) end
      restore = swap(copies)
    end
    local now = random.get_state()
    random.set_state(rng_state)
    local re = pack(pcall(M.enable_grad, fn, unpack(again, 1, inputs.n)))
    random.set_state(now)
    if restore then restore() end
    if not re[1] then error(re[2], 0) end
    local roots, gs = {}, {}
    local k = 0
    for i = 2, re.n do
      if Tensor.is_tensor(re[i]) then
        k = k + 1
        if re[i].requires_grad and grads[k] then
          roots[#roots + 1] = re[i]
          gs[#gs + 1] = grads[k]
        end
      end
    end
    if #roots > 0 then M.backward(roots, gs) end
    -- Gradients for the data inputs, then for swapped parameters (plain
    -- ones had theirs accumulated by the nested backward: nil entries).
    local result = {}
    for i = 1, n_data do result[i] = leaves[i].grad end
    if swap then
      for j, p in ipairs(ptensors) do result[n_data + j] = copies[p].grad end
    end
    return result
  end)
  return unpack(outputs, 1, outputs.n)
end

-- fsdp.autograd.checkpoint(fn, ...): fn(...) keeping only its inputs for
-- backward, which runs fn again to get what it needs (activation
-- checkpointing of a function; fsdp.checkpoint applies it to modules).
function M.checkpoint(fn, ...)
  return M.checkpoint_with_params({}, fn, ...)
end

M.pack = pack

-- The tensors among packed values ({n=, ...}: a forward's arguments or
-- results, each a tensor or a plain table of them) that require grad, and
-- a function that puts replacements for them back into a copy.
function M.grad_tensors(packed)
  local list, places = {}, {}
  for i = 1, packed.n do
    local v = packed[i]
    if Tensor.is_tensor(v) then
      if v.requires_grad then list[#list + 1] = v; places[#places + 1] = { i } end
    elseif type(v) == 'table' and getmetatable(v) == nil then
      for k, t in pairs(v) do
        if Tensor.is_tensor(t) and t.requires_grad then list[#list + 1] = t; places[#places + 1] = { i, k } end
      end
    end
  end
  return list, function(new)
    local r = { n = packed.n }
    for i = 1, packed.n do r[i] = packed[i] end
    for j, place in ipairs(places) do
      local i, k = place[1], place[2]
      if k == nil then
        r[i] = new[j]
      else
        if r[i] == packed[i] then
          local copy = {}
          for kk, vv in pairs(packed[i]) do copy[kk] = vv end
          r[i] = copy
        end
        r[i][k] = new[j]
      end
    end
    return r
  end
end

-- A Lua node between the tensors of `packed` that require grad (as
-- grad_tensors finds them) and detached copies of them: backward(grads),
-- which returns the gradients to pass on, runs when theirs arrives (how
-- fsdp.shard's hooks and fsdp.plan's trace see a module's backward begin
-- and end). The closure must not hold the tensors, or their bytes stay
-- alive until then. Returns the packed values with the copies, and
-- whether a node was attached (false: nothing requires grad).
function M.on_gradient(name, packed, backward)
  local list, rebuild = M.grad_tensors(packed)
  if #list == 0 then return packed, false end
  local outs = {}
  for i, t in ipairs(list) do outs[i] = t:detach() end
  M.attach(name, list, outs, backward)
  return rebuild(outs), true
end

-- t:backward() runs this engine (fsdp.tensor sits below this file).
Tensor.run_backward = M.backward

return M
