-- fsdp.fake: fake mode, in which tensor factories make tensors that report
-- a real device but own no storage.
--
--   local model = fsdp.fake(function()
--     return llama.build('Llama-2-70b')             -- 69e9 parameters, 0 bytes
--   end, { device = 'cuda:0' })
--   print(model.lm_head.weight)    -- tensor(..., size=(32000, 8192), device='cuda:0', fake=true)
--
-- Meta tensors say "no device"; a fake tensor says "this will live on
-- cuda:0" (or cpu) and is still only a shape, so code that plans placement
-- or sharding sees the real target device while nothing is allocated, on
-- machines without that device too. Inside fn every factory (empty, zeros,
-- ones, full, arange, tensor, rand, randn, randint) returns a fake tensor:
-- on opts.device, which becomes the default device for the call, or on
-- the device the factory was asked for. Ops on fake tensors give fake
-- results (the core infers their shapes as on meta), and writes to them
-- (init rules, fill_) do nothing, so model constructors and init code run
-- unchanged. A factory asked for 'meta' still gives a meta tensor.
--
-- The mode is a dynamic extent: it ends when fn returns or raises, the
-- default device is restored either way, and calls nest.
local core = require 'fsdp.core'

local M = {}

local depth = 0

-- The default device lives in fsdp (lua/fsdp/init.lua, above this file:
-- its factories ask M.active); it hands its getter and setter over here.
local device_of = {}
function M.use_default_device(get, set) device_of.get, device_of.set = get, set end

-- True while some fsdp.fake call is running (the factories ask).
function M.active() return depth > 0 end

local function finish(saved_device, ok, ...)
  depth = depth - 1
  device_of.set(saved_device)
  if not ok then error((...), 0) end
  return ...
end

-- Run fn(...) in fake mode and return its results. opts.device (a device
-- name such as 'cuda:0' or 'cpu') is the default device inside fn.
function M.run(fn, opts, ...)
  if type(fn) ~= 'function' then
    core.fail(('fsdp.fake: expected a function, got %s'):format(type(fn)))
  end
  if opts ~= nil and type(opts) ~= 'table' then
    core.fail(('fsdp.fake: expected an options table after the function, got %s'):format(type(opts)))
  end
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= 'device' then core.fail(('fsdp.fake: unknown option %s (valid: device)'):format(tostring(k))) end
  end
  local saved_device = device_of.get()
  -- Validate the device before entering the mode: a bad name is the
  -- caller's mistake and names their line.
  if opts.device ~= nil then core.device(opts.device) end
  depth = depth + 1
  if opts.device ~= nil then device_of.set(opts.device) end
  return finish(saved_device, pcall(fn, ...))
end

return M
