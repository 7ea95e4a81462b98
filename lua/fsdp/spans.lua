-- fsdp.spans: how the layers below observability (nn modules, the sharded
-- units and their hooks) report timed spans of their work without knowing
-- who listens. fsdp.observe.profiler, a layer above them, subscribes while
-- it records a trace; with no subscriber a report costs one field read,
-- since callers test `spans.on` before timing anything.
--
--   local spans = require 'fsdp.spans'
--   if spans.on then
--     local t0 = spans.now(); work(); spans.span('all-gather ' .. label, 'comm', t0, { bytes = n })
--   else work() end
local epoch = require('fsdp.clock').epoch

local M = { on = false }

-- Microseconds of the wall clock (the profiler's time base).
function M.now() return epoch() * 1e6 end

local sink, namer

-- Send every span to fn(name, cat, t0, args) from now on, and name a
-- module's forward span by name_module(m); subscribe(nil) stops. One
-- subscriber at a time (the profiler).
function M.subscribe(fn, name_module)
  sink, namer = fn, name_module
  M.on = fn ~= nil
end

-- A complete span from t0 (M.now() when it began) to now; cat: its
-- category (forward, backward, comm, wait, ...).
function M.span(name, cat, t0, args)
  if sink then sink(name, cat, t0, args) end
end

-- The name a module's forward span gets: the subscriber's (its path in
-- the profiled model), else its class.
function M.module_name(m)
  if namer then return namer(m) end
  return tostring(rawget(getmetatable(m) or {}, '__name') or 'module')
end

return M
