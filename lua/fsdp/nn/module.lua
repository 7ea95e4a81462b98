-- fsdp.nn.module: nn.Module, the base class of every layer and model.
--
--   local Block = nn.Module:extend('Block')
--   function Block:__init(dim, opts)
--     self.norm = nn.RMSNorm(dim, opts)             -- a child, by assignment
--     self.proj = nn.Linear(dim, dim, opts)
--   end
--   function Block:forward(x) return x + self.proj(self.norm(x)) end
--
--   local m = Block(64, {device = 'meta'})          -- nothing allocated
--   m:init_weights({seed = 0, device = 'cpu'})      -- materialise and fill
--   local y = m(x)                                  -- hooks, then forward
--
-- As in PyTorch, assigning a Module to a field registers a child and
-- assigning a parameter (nn.Parameter) registers a parameter, in order;
-- names are fully qualified by walking the tree ("layers.0.mlp.up.weight").
-- A tensor shared by two modules (tied embeddings) is one parameter: the
-- first name wins in named_parameters() and it is counted once.
--
-- Calling a module runs its forward pre-hooks, forward, then forward hooks
-- (the sharding layer all-gathers and frees parameters there). An error
-- raised anywhere inside is re-raised once, by the innermost module, as
-- "in <path>: <message>" so a failure deep in a model names its place.
local autograd = require 'fsdp.autograd'
local factories = require 'fsdp.factories'
local random = require 'fsdp.random'
local Tensor = require 'fsdp.tensor'
local core = require 'fsdp.core'
local repr = require 'fsdp.nn.repr'
local spans = require 'fsdp.spans'
local parameter = require 'fsdp.nn.parameter'

local is_tensor = Tensor.is_tensor
local pack = function(...) return { n = select('#', ...), ... } end
local unpack = unpack

local Module = {}

-- Fields of an instance that are not attributes of the model.
local function new_state()
  return {
    _parameters = {}, _param_names = {},
    _buffers = {}, _buffer_names = {}, _non_persistent = {},
    _modules = {}, _module_names = {},
    _forward_pre_hooks = {}, _forward_hooks = {},
    training = true,
  }
end

-- True for module instances (their metatable is a module class).
local function is_module(x)
  if type(x) ~= 'table' then return false end
  local mt = getmetatable(x)
  return mt ~= nil and rawget(mt, '__is_module_class') == true and rawget(x, '_modules') ~= nil
end
Module.is_module = is_module

local function class_name(self)
  return rawget(getmetatable(self), '__name') or 'Module'
end

-- errors: "in <path>: ..." ------------------------------------------------------

-- The message this process last prefixed; an outer module that sees it
-- again re-raises it unchanged, so only the innermost module names itself.
local last_prefixed = nil

-- The fully qualified name of a module from the root of its tree ('' for
-- the root), following the parents recorded at registration.
function Module:path()
  local parts, m, depth = {}, self, 0
  while true do
    local parent = rawget(m, '_parent')
    if parent == nil or depth > 10000 then break end
    table.insert(parts, 1, rawget(m, '_key'))
    m, depth = parent, depth + 1
  end
  return table.concat(parts, '.')
end

-- Functions (module, message) -> text or nil that add to the error of a
-- failed module call what a higher layer knows about its cause (fsdp.shard
-- adds one: a parameter of a unit that was not gathered). Each text found
-- is appended in parentheses.
Module.error_hints = {}

local function prefixed(self, err)
  if type(err) ~= 'string' or err == last_prefixed then return err end
  local path = self:path()
  if path == '' then path = class_name(self) end
  local hints = {}
  for _, hint in ipairs(Module.error_hints) do
    local text = hint(self, err)
    if text then hints[#hints + 1] = ' (' .. text .. ')' end
  end
  last_prefixed = ('in %s: %s%s'):format(path, err, table.concat(hints))
  return last_prefixed
end

local function finish(self, ok, ...)
  if ok then return ... end
  error(prefixed(self, (...)), 0)
end

-- calling ------------------------------------------------------------------------

-- Pre-hooks get (module, ...args) and may return replacement args; forward
-- hooks get (module, args, output) with args packed ({n=, ...}) and may
-- return a replacement for the (first) output; registered with
-- {all_outputs = true} they get every output packed and may return a
-- replacement pack.
local function run_hooked(self, ...)
  local args = pack(...)
  local pre = rawget(self, '_forward_pre_hooks')
  if #pre > 0 then
    for _, h in ipairs({ unpack(pre) }) do
      local r = pack(h.fn(self, unpack(args, 1, args.n)))
      if r.n > 0 and not (r.n == 1 and r[1] == nil) then args = r end
    end
  end
  local out = pack(self:forward(unpack(args, 1, args.n)))
  local post = rawget(self, '_forward_hooks')
  if #post > 0 then
    for _, h in ipairs({ unpack(post) }) do
      if h.all_outputs then
        out = h.fn(self, args, out) or out
      else
        local r = h.fn(self, args, out[1])
        if r ~= nil then out[1] = r; out.n = math.max(out.n, 1) end
      end
    end
  end
  return unpack(out, 1, out.n)
end

local function plain_call(self, ...)
  if #rawget(self, '_forward_pre_hooks') == 0 and #rawget(self, '_forward_hooks') == 0 then
    return finish(self, pcall(self.forward, self, ...))
  end
  return finish(self, pcall(run_hooked, self, ...))
end

local function forward_span(self, t0, ...)
  spans.span(spans.module_name(self), 'forward', t0)
  return ...
end

-- With a trace being recorded (fsdp.observe.profiler subscribed to
-- fsdp.spans) every call is a span named by the module's path; otherwise
-- one field read more.
local function call(self, ...)
  if spans.on then return forward_span(self, spans.now(), plain_call(self, ...)) end
  return plain_call(self, ...)
end

function Module:forward()
  core.fail(('%s has no forward()'):format(class_name(self)))
end

local function add_hook(list, fn, opts, what)
  if type(fn) ~= 'function' then
    core.fail(('%s expects a function, got %s'):format(what, type(fn)))
  end
  local entry = { fn = fn, all_outputs = opts and opts.all_outputs or nil }
  if opts and opts.prepend then table.insert(list, 1, entry) else list[#list + 1] = entry end
  return {
    remove = function()
      for i = 1, #list do
        if list[i] == entry then table.remove(list, i); return end
      end
    end,
  }
end

-- fn(module, ...) before forward; returning values replaces the arguments.
-- {prepend=true} runs it before the hooks already registered. Returns a
-- handle whose :remove() unregisters it.
function Module:register_forward_pre_hook(fn, opts)
  return add_hook(rawget(self, '_forward_pre_hooks'), fn, opts, 'register_forward_pre_hook')
end

-- fn(module, args, output) after forward; returning a value replaces the
-- output. {all_outputs = true}: fn(module, args, outputs) with every output
-- packed ({n=, ...}), returning a replacement pack or nil.
function Module:register_forward_hook(fn, opts)
  return add_hook(rawget(self, '_forward_hooks'), fn, opts, 'register_forward_hook')
end

-- registration ---------------------------------------------------------------------

local function check_name(self, name, what)
  if type(name) ~= 'string' and type(name) ~= 'number' then
    core.fail(('%s: name must be a string, got %s'):format(what, type(name)))
  end
  name = tostring(name)
  if name == '' or name:find('.', 1, true) then
    core.fail(('%s: name %s must be non-empty and contain no "."'):format(what, repr.str(name)))
  end
  if getmetatable(self)[name] ~= nil then
    core.fail(('%s: name %s collides with a method or field of %s'):format(what, repr.str(name), class_name(self)))
  end
  return name
end

local function is_registered(self, name)
  return rawget(self, '_parameters')[name] ~= nil or rawget(self, '_modules')[name] ~= nil
      or rawget(self, '_buffers')[name] ~= nil
end

local function add_name(list, name)
  for i = 1, #list do if list[i] == name then return end end
  list[#list + 1] = name
end

local function remove_name(list, name)
  for i = 1, #list do if list[i] == name then table.remove(list, i); return end end
end

-- Register (or with m == nil, remove) a child module under `name`. The
-- child records its first parent, which gives it its path for errors.
function Module:add_module(name, m)
  name = check_name(self, name, 'add_module')
  local mods = rawget(self, '_modules')
  if m == nil then
    mods[name] = nil
    remove_name(rawget(self, '_module_names'), name)
    return self
  end
  if not is_module(m) then
    core.fail(('add_module: %s is a %s, not a Module'):format(repr.str(name), type(m)))
  end
  if rawget(self, '_parameters')[name] or rawget(self, '_buffers')[name] then
    core.fail(('add_module: %s is already a parameter or buffer of %s'):format(repr.str(name), class_name(self)))
  end
  if rawget(m, '_parent') == nil and m ~= self then
    rawset(m, '_parent', self)
    rawset(m, '_key', name)
  end
  mods[name] = m
  add_name(rawget(self, '_module_names'), name)
  return self
end
Module.register_module = Module.add_module

-- Register a parameter (a tensor; nn.Parameter marks it) under `name`, or
-- with p == nil reserve the name with no parameter (a bias=false Linear).
function Module:register_parameter(name, p)
  name = check_name(self, name, 'register_parameter')
  if p ~= nil and not is_tensor(p) then
    core.fail(('register_parameter: %s is a %s, not a Tensor'):format(repr.str(name), type(p)))
  end
  if rawget(self, '_modules')[name] or rawget(self, '_buffers')[name] then
    core.fail(('register_parameter: %s is already a module or buffer of %s'):format(repr.str(name), class_name(self)))
  end
  if p ~= nil and not rawget(p, 'is_param') then parameter.mark(p) end
  rawget(self, '_parameters')[name] = p
  add_name(rawget(self, '_param_names'), name)
  return self
end

-- Register a buffer: state that is not trained (running statistics, rotary
-- tables). {persistent=false} keeps it out of state_dict(). A buffer may
-- carry an init rule (t.init) that init_weights applies.
function Module:register_buffer(name, t, opts)
  name = check_name(self, name, 'register_buffer')
  if t ~= nil and not is_tensor(t) then
    core.fail(('register_buffer: %s is a %s, not a Tensor'):format(repr.str(name), type(t)))
  end
  if rawget(self, '_modules')[name] or rawget(self, '_parameters')[name] then
    core.fail(('register_buffer: %s is already a module or parameter of %s'):format(repr.str(name), class_name(self)))
  end
  rawget(self, '_buffers')[name] = t
  add_name(rawget(self, '_buffer_names'), name)
  rawget(self, '_non_persistent')[name] = (opts and opts.persistent == false) or nil
  return self
end

-- classes ----------------------------------------------------------------------------

local metamethods = {}

-- Attribute lookup: parameters, buffers and children by name, then methods.
local function make_index(cls)
  return function(self, k)
    local v = rawget(self, '_parameters')
    if v then
      v = v[k]
      if v ~= nil then return v end
      v = rawget(self, '_modules')[k]
      if v ~= nil then return v end
      v = rawget(self, '_buffers')[k]
      if v ~= nil then return v end
    end
    return cls[k]
  end
end

function metamethods.__newindex(self, k, v)
  if type(k) == 'string' then
    if is_module(v) then return self:add_module(k, v) end
    if is_tensor(v) then
      if rawget(v, 'is_param') or rawget(self, '_parameters')[k] ~= nil then
        return self:register_parameter(k, v)
      end
      if rawget(self, '_buffers')[k] ~= nil then
        rawget(self, '_buffers')[k] = v
        return
      end
    elseif v == nil and is_registered(self, k) then
      rawget(self, '_modules')[k] = nil
      remove_name(rawget(self, '_module_names'), k)
      rawget(self, '_parameters')[k] = nil
      rawget(self, '_buffers')[k] = nil
      return
    end
  end
  rawset(self, k, v)
end

metamethods.__call = call

-- The names Tab completion offers (fsdp.complete): children, parameters,
-- buffers, plain fields and the methods of the class and its parents.
function metamethods.__dir(self)
  local names = {}
  for _, list in ipairs { '_module_names', '_param_names', '_buffer_names' } do
    for _, k in ipairs(rawget(self, list)) do names[#names + 1] = k end
  end
  for k in pairs(self) do
    if type(k) == 'string' then names[#names + 1] = k end
  end
  local cls = getmetatable(self)
  while cls do
    for k in pairs(cls) do
      if type(k) == 'string' then names[#names + 1] = k end
    end
    cls = rawget(cls, 'super')
  end
  return names
end

function metamethods.__tostring(self)
  return self:__repr()
end

local function construct(cls, ...)
  local self = setmetatable(new_state(), cls)
  self:__init(...)
  return self
end

local function setup_class(cls, name, parent)
  for k, v in pairs(metamethods) do cls[k] = v end
  cls.__index = make_index(cls)
  cls.__name = name
  cls.__is_module_class = true
  cls.super = parent
  return setmetatable(cls, {
    __index = parent,
    __call = construct,
    __tostring = function() return 'class ' .. name end,
  })
end

-- A new class deriving from this one: `local Linear = nn.Module:extend('Linear')`.
-- Instances are made by calling the class; its __init(self, ...) runs on
-- a fresh module (a parent's __init is reached as Parent.__init(self, ...)).
function Module:extend(name)
  if type(name) ~= 'string' then
    core.fail(('extend expects a class name, got %s'):format(type(name)))
  end
  return setup_class({}, name, self)
end

-- True when this module is an instance of cls or of a class derived from it.
function Module:is_instance_of(cls)
  local c = getmetatable(self)
  while c do
    if c == cls then return true end
    c = rawget(c, 'super')
  end
  return false
end

function Module:class_name() return class_name(self) end

function Module:__init() end

-- traversal ------------------------------------------------------------------------

-- {name, module} pairs of the direct children, in registration order.
function Module:named_children()
  local out, mods = {}, rawget(self, '_modules')
  for _, name in ipairs(rawget(self, '_module_names')) do
    if mods[name] then out[#out + 1] = { name, mods[name] } end
  end
  return out
end

function Module:children()
  local out = {}
  for _, nc in ipairs(self:named_children()) do out[#out + 1] = nc[2] end
  return out
end

-- {name, module} pairs of this module ('' or prefix) and all descendants,
-- depth first in registration order; a module reachable twice is listed
-- once, under its first name, unless opts.remove_duplicate == false.
function Module:named_modules(opts)
  opts = opts or {}
  local dedup = opts.remove_duplicate ~= false
  local out, seen = {}, {}
  local function walk(m, prefix)
    if dedup then
      if seen[m] then return end
      seen[m] = true
    end
    out[#out + 1] = { prefix, m }
    local mods = rawget(m, '_modules')
    for _, name in ipairs(rawget(m, '_module_names')) do
      local child = mods[name]
      if child then walk(child, prefix == '' and name or prefix .. '.' .. name) end
    end
  end
  walk(self, opts.prefix or '')
  return out
end

function Module:modules()
  local out = {}
  for _, nm in ipairs(self:named_modules()) do out[#out + 1] = nm[2] end
  return out
end

local function named_tensors(self, opts, field, order_field, persistent_only)
  opts = opts or {}
  local dedup = opts.remove_duplicate ~= false
  local out, seen = {}, {}
  for _, nm in ipairs(self:named_modules({ remove_duplicate = dedup, prefix = opts.prefix })) do
    local prefix, m = nm[1], nm[2]
    local ts = rawget(m, field)
    local skip = persistent_only and rawget(m, '_non_persistent') or {}
    for _, name in ipairs(rawget(m, order_field)) do
      local t = ts[name]
      if t ~= nil and not skip[name] and not (dedup and seen[t]) then
        seen[t] = true
        out[#out + 1] = { prefix == '' and name or prefix .. '.' .. name, t }
      end
    end
  end
  return out
end

-- {name, tensor} pairs of all parameters with fully qualified names, in
-- registration order; a shared tensor appears once under its first name
-- (opts.remove_duplicate == false lists every name).
function Module:named_parameters(opts)
  return named_tensors(self, opts, '_parameters', '_param_names')
end

function Module:parameters(opts)
  local out = {}
  for _, np in ipairs(self:named_parameters(opts)) do out[#out + 1] = np[2] end
  return out
end

function Module:named_buffers(opts)
  return named_tensors(self, opts, '_buffers', '_buffer_names')
end

function Module:buffers(opts)
  local out = {}
  for _, nb in ipairs(self:named_buffers(opts)) do out[#out + 1] = nb[2] end
  return out
end

-- Number of parameter elements, a shared tensor counted once (what
-- PyTorch's sum(p.numel() for p in model.parameters()) reports).
function Module:num_parameters()
  local n = 0
  for _, p in ipairs(self:parameters()) do n = n + p:numel() end
  return n
end

-- fn(module) on every descendant, children before their parent (as
-- PyTorch's apply). Returns self.
function Module:apply(fn)
  for _, child in ipairs(self:children()) do child:apply(fn) end
  fn(self)
  return self
end

-- Training mode of this module and every descendant (dropout reads it).
function Module:train(mode)
  if mode == nil then mode = true end
  for _, m in ipairs(self:modules()) do rawset(m, 'training', mode and true or false) end
  return self
end

function Module:eval() return self:train(false) end

-- Drop the gradients of all parameters (PyTorch's set_to_none=True).
function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p.grad = nil end
  return self
end

-- state ----------------------------------------------------------------------------------

-- The parameters and persistent buffers by fully qualified name, every
-- name of a shared tensor included (as PyTorch's state_dict), and the
-- names in order: `local sd, keys = model:state_dict()`.
function Module:state_dict()
  local sd, keys = {}, {}
  for _, nm in ipairs(self:named_modules({ remove_duplicate = false })) do
    local prefix, m = nm[1], nm[2]
    local function add(field, order, skip)
      local ts = rawget(m, field)
      for _, name in ipairs(rawget(m, order)) do
        if ts[name] ~= nil and not (skip and skip[name]) then
          local key = prefix == '' and name or prefix .. '.' .. name
          if sd[key] == nil then keys[#keys + 1] = key end
          sd[key] = ts[name]
        end
      end
    end
    add('_parameters', '_param_names')
    add('_buffers', '_buffer_names', rawget(m, '_non_persistent'))
  end
  return sd, keys
end

local no_grad = autograd.no_grad

-- Copy values from a name -> tensor table into this model's parameters and
-- buffers (converting dtype and device). With strict (the default) any
-- missing or unexpected key, or a shape mismatch, is an error naming the
-- keys; otherwise the missing and unexpected keys are returned.
function Module:load_state_dict(state, opts)
  opts = opts or {}
  local strict = opts.strict ~= false
  local own, keys = self:state_dict()
  local missing, unexpected = {}, {}
  -- A tensor registered under several names (tied embeddings) is loaded
  -- when any of its names is in the state: Hugging Face checkpoints of
  -- tied models omit lm_head.weight.
  local loaded = {}
  for _, key in ipairs(keys) do
    if state[key] ~= nil then loaded[own[key]] = true end
  end
  for _, key in ipairs(keys) do
    local src = state[key]
    if src == nil then
      if not loaded[own[key]] then missing[#missing + 1] = key end
    else
      local dst = own[key]
      -- a TP shard (fsdp.tp) takes its slice of the logical tensor
      local tp = rawget(dst, 'tp')
      local ds, ss = tp and tp.global_shape or rawget(dst, 'fsdp_shape') or dst.shape, src.shape
      if core.format_shape(ds) ~= core.format_shape(ss) then
        core.fail(('load_state_dict: size mismatch for %s: the checkpoint has %s, the model %s')
          :format(key, core.format_shape(ss), core.format_shape(ds)))
      end
    end
  end
  for key in pairs(state) do
    if own[key] == nil then unexpected[#unexpected + 1] = key end
  end
  table.sort(unexpected)
  if strict and (#missing > 0 or #unexpected > 0) then
    local parts = {}
    if #missing > 0 then parts[#parts + 1] = 'missing keys: ' .. table.concat(missing, ', ') end
    if #unexpected > 0 then parts[#parts + 1] = 'unexpected keys: ' .. table.concat(unexpected, ', ') end
    core.fail('load_state_dict: ' .. table.concat(parts, '; '))
  end
  no_grad(function()
    for _, key in ipairs(keys) do
      local src, dst = state[key], own[key]
      if src ~= nil then
        -- A shard segment of a sharded model takes only its slice: with a
        -- memory-mapped checkpoint no rank reads the whole tensor.
        local tp, offset = rawget(dst, 'tp'), rawget(dst, 'fsdp_offset')
        if tp then
          local n = src:size(tp.dim) / tp.size
          src = src:narrow(tp.dim, tp.rank * n, n):contiguous()
        end
        if offset then src = src:reshape(-1):narrow(0, offset, dst:numel()) end
        dst:copy_(src)
      end
    end
  end)
  return missing, unexpected
end

-- conversion and initialisation -------------------------------------------------------

-- Replace every parameter and buffer t by make(t, name) (or keep it when
-- make returns t). A shared tensor is replaced once and stays shared; the
-- replacement keeps the Lua fields (init rule, is_param) and requires_grad.
local function replace_tensors(self, make)
  local done = {}
  local function convert(t, name)
    local r = done[t]
    if r then return r end
    r = make(t, name)
    if r ~= t then
      for k, v in pairs(t) do
        if type(k) == 'string' and k:sub(1, 1) ~= '_' and rawget(r, k) == nil then rawset(r, k, v) end
      end
      if rawget(t, 'is_param') and r.requires_grad_ and r:is_floating_point() then
        r:requires_grad_(true)
      end
    end
    done[t] = r
    return r
  end
  for _, nm in ipairs(self:named_modules()) do
    local prefix, m = nm[1], nm[2]
    for _, field in ipairs({ '_parameters', '_buffers' }) do
      local ts = rawget(m, field)
      for _, name in ipairs(rawget(m, field == '_parameters' and '_param_names' or '_buffer_names')) do
        if ts[name] ~= nil then
          ts[name] = convert(ts[name], prefix == '' and name or prefix .. '.' .. name)
        end
      end
    end
  end
  return self
end

-- Move and/or convert parameters and buffers: module:to({device=, dtype=})
-- or module:to('bf16') / module:to('cpu'). dtype applies to floating-point
-- tensors only (integer buffers keep theirs), as in PyTorch.
function Module:to(x)
  local opts = x
  if type(x) == 'string' then
    if core.C.fl_dtype_parse(x) >= 0 then opts = { dtype = x }
    else core.C.fl_clear_error(); opts = { device = x } end
  elseif type(x) ~= 'table' then
    core.fail(('to() expects {device=, dtype=} or a name, got %s'):format(type(x)))
  end
  return no_grad(function()
    return replace_tensors(self, function(t)
      local target = { device = opts.device }
      if opts.dtype and t:is_floating_point() then target.dtype = opts.dtype end
      local r = t:to(target)
      if r ~= t and r.detach and r.grad_fn ~= nil then r = r:detach() end
      return r
    end)
  end)
end

-- Give every parameter and buffer fresh, uninitialised storage on `device`
-- (same shape and dtype): the step from a meta model to a real one, before
-- init_weights or load_state_dict.
function Module:to_empty(opts)
  local device = opts and opts.device
  if device == nil then core.fail('to_empty expects {device=...}') end
  return replace_tensors(self, function(t)
    return factories.empty(t.shape, { device = device, dtype = t.dtype })
  end)
end

-- Fill every parameter (and buffer) that has an init rule from the rule,
-- keyed by (seed, fully qualified name, element index), see
-- fsdp.nn.parameter. opts: seed (default fsdp.initial_seed()), device (to
-- materialise a meta model there first). On meta nothing is allocated or
-- computed. Tensors without a rule keep their values.
function Module:init_weights(opts)
  opts = opts or {}
  if opts.device then self:to_empty({ device = opts.device }) end
  local seed = opts.seed or random.initial_seed()
  local function fill(list, what)
    for _, nt in ipairs(list) do
      local name, t = nt[1], nt[2]
      local rule = rawget(t, 'init')
      if rule ~= nil then
        parameter.fill(t, rule, { seed = seed, name = name }, what .. ' ' .. name)
      end
    end
  end
  no_grad(function()
    fill(self:named_parameters(), 'parameter')
    fill(self:named_buffers(), 'buffer')
  end)
  return self
end

-- printing ----------------------------------------------------------------------------

-- One line of this module's own settings, as PyTorch's extra_repr
-- ("in_features=4096, out_features=11008, bias=False"); '' by default.
function Module:extra_repr()
  return ''
end

-- PyTorch's Module.__repr__: the class name, extra_repr and the children
-- indented, one per line.
function Module:__repr()
  local extra = self:extra_repr()
  local extra_lines = {}
  if extra ~= '' then
    for line in (extra .. '\n'):gmatch('(.-)\n') do extra_lines[#extra_lines + 1] = line end
  end
  local child_lines = {}
  for _, nc in ipairs(self:named_children()) do
    child_lines[#child_lines + 1] = '(' .. nc[1] .. '): ' .. repr.addindent(tostring(nc[2]), 2)
  end
  local s = class_name(self) .. '('
  if #extra_lines == 1 and #child_lines == 0 then
    s = s .. extra_lines[1]
  elseif #extra_lines + #child_lines > 0 then
    local lines = {}
    for _, l in ipairs(extra_lines) do lines[#lines + 1] = l end
    for _, l in ipairs(child_lines) do lines[#lines + 1] = l end
    s = s .. '\n  ' .. table.concat(lines, '\n  ') .. '\n'
  end
  return s .. ')'
end

setup_class(Module, 'Module', nil)

return Module
