-- fsdp.activations.offload (fsdp.offload_activations): activation offload to pinned CPU memory,
-- chosen by a predicate over modules (the interface of fsdp.checkpoint).
--
--   local llama = require 'models.llama'
--   fsdp.offload_activations(model, function(m) return m:is_instance_of(llama.DecoderLayer) end)
--   fsdp.offload_activations(model, is_block, {every = 2})   -- every second match
--
-- A matching module's forward runs inside an offload scope: the tensors
-- its ops save for backward move to pinned CPU memory as they are saved
-- (queued copies on the device's copy stream, overlapping the forward) and
-- come back just before the backward that reads them
-- (core/autograd/offload.c, [Note: offload streams]), so the
-- device keeps only what the forward still uses. Parameters, a sharded
-- unit's gathered parameters and cpu tensors are never moved; on a cpu
-- model it changes nothing. PyTorch: save_on_cpu / offload_wrapper.
--
-- With fsdp.checkpoint on the same module (either order) the checkpoint's
-- saved inputs are what moves: the checkpointed forward saves nothing
-- else, and the recompute in backward runs without offload.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local autograd = require 'fsdp.autograd'
local select_modules = require 'fsdp.activations.select_modules'
local C = core.C

local M = {}

-- fn(...) inside an offload scope, closed even when fn raises.
function M.scoped(fn, ...)
  core.check(C.fl_offload_begin())
  local res = autograd.pack(pcall(fn, ...))
  core.check(C.fl_offload_end())
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

local function wrap(m)
  local forward = m.forward
  m.forward = function(self, ...)
    -- Nothing is saved without grad mode; in backward the forward is a
    -- checkpoint's recompute, whose saved tensors are used at once.
    if not autograd.is_grad_enabled() or autograd.in_backward() then return forward(self, ...) end
    return M.scoped(forward, self, ...)
  end
  m._offloaded = true
end

local function check_args(model, check_fn, opts)
  if type(model) ~= 'table' or type(model.named_modules) ~= 'function' then
    core.fail(('offload_activations: expects a module first, got %s'):format(type(model)))
  end
  if type(check_fn) ~= 'function' then
    core.fail(('offload_activations: expects a predicate function(module, name) second, got %s')
      :format(type(check_fn)))
  end
  if opts ~= nil and type(opts) ~= 'table' then
    core.fail(('offload_activations: options must be a table like {every = 2}, got %s'):format(type(opts)))
  end
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= 'every' then
      core.fail(("offload_activations: unknown option '%s' (known: every)"):format(tostring(k)))
    end
  end
  local every = opts.every or 1
  if validate.problem(every, validate.COUNT) then
    core.fail(('offload_activations: every must be a positive integer, got %s'):format(validate.show(every)))
  end
  return every
end

-- Offload the activations of the modules of `model` for which
-- check_fn(module, name) is true, outermost first (a match inside an
-- offloaded module is covered by its scope). opts.every = k keeps only
-- every k-th match. Returns the names wrapped.
function M.apply(model, check_fn, opts)
  local every = check_args(model, check_fn, opts)
  local wrapped = {}
  for _, nm in ipairs(select_modules(model, check_fn, every, '_offloaded')) do
    wrap(nm[2])
    wrapped[#wrapped + 1] = nm[1]
  end
  return wrapped
end

return setmetatable(M, { __call = function(_, ...) return M.apply(...) end })
