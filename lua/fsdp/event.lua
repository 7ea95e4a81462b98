-- fsdp.Event: a point in a device's queue of work, as torch.cuda.Event.
--
--   local start, stop = fsdp.Event('cuda:0', {timing = true}), fsdp.Event('cuda:0', {timing = true})
--   start:record(); model(x); stop:record()
--   stop:synchronize()
--   print(start:elapsed_time(stop), 'ms')
--
-- On cuda an event marks the kernels and copies queued so far (the compute
-- stream, which NCCL collectives join when waited for) and is done once they
-- have run; on the CPU work has run when its call returns, so an event is
-- done when recorded and its time is the host clock. Waiting (an event's
-- synchronize, fsdp.synchronize) fails after the collective timeout if a
-- collective the device waits for never completes, instead of hanging.
local core = require 'fsdp.core'
local ffi, C = core.ffi, core.C

local Event = {}
Event.__index = Event

local function new(device, opts)
  opts = opts or {}
  if type(opts) ~= 'table' then core.fail('Event: options must be a table, not ' .. type(opts)) end
  for k in pairs(opts) do
    if k ~= 'timing' then core.fail(('Event: unknown option %q (expected timing)'):format(tostring(k))) end
  end
  local d = core.device(device or 'cuda:0')
  local ptr = C.fl_event_new(d, opts.timing and true or false)
  if ptr == nil then core.raise() end
  return setmetatable({ _e = ffi.gc(ptr, C.fl_event_free), device = core.device_name(d),
                        timing = opts.timing and true or false }, Event)
end

-- Mark the work queued on the device so far; returns the event.
function Event:record()
  core.check(C.fl_event_record(self._e))
  return self
end

local done_buf = ffi.new('bool[1]')

-- True once everything queued before the record has run (without waiting).
function Event:query()
  core.check(C.fl_event_query(self._e, done_buf))
  return done_buf[0]
end

-- Block until everything queued before the record has run.
function Event:synchronize()
  core.check(C.fl_event_synchronize(self._e))
end

local ms_buf = ffi.new('double[1]')

-- Milliseconds from this event to `other` (both timing events, recorded on
-- one device and done).
function Event:elapsed_time(other)
  if getmetatable(other) ~= Event then core.fail('Event:elapsed_time: expected an Event') end
  core.check(C.fl_event_elapsed_ms(self._e, other._e, ms_buf))
  return ms_buf[0]
end

function Event:__tostring()
  return ('Event(%s%s)'):format(self.device, self.timing and ', timing' or '')
end

return setmetatable({ new = new, Event = Event }, { __call = function(_, ...) return new(...) end })
