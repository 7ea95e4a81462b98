-- fsdp.observe.profiler: a trace of what a rank does over a few steps, as Chrome
-- trace JSON (chrome://tracing, https://ui.perfetto.dev): spans for each
-- module's forward, each sharded unit's backward, all-gathers and their
-- waits, reshards, reduce-scatters and their waits (with bytes), the
-- optimizer, data loading, validation and checkpoint saves, every step;
-- and a counter track of the device memory in use at each span's end.
--
--   local profiler = require 'fsdp.observe.profiler'
--   profiler.start({ model = model, device = 'cpu', rank = 0 })
--   ... steps ...
--   profiler.stop('profile/trace-rank0.json')
--   profiler.span('optimizer', 'optim', t0)          -- a span from t0 = profiler.now() to now
--
-- The recipes drive it with --profile_steps=A:B (fsdp.metrics: the Logger
-- starts it before step A and writes the file after step B), one file per
-- rank (pid = the rank, so tools/trace_summary.lua --merge puts the
-- ranks side by side). Time is the wall clock in microseconds, so the
-- files of the ranks of one machine line up.
--
-- Instrumented code asks `profiler.on` (one field read) before anything
-- else: with no trace being recorded a module call or a unit's
-- collective costs nothing more. Spans are host time: on a GPU a span is
-- the time to queue the work (device-side timing is not recorded), a
-- "wait" span is where the host blocked on a collective, which on the CPU
-- is the communication not hidden behind compute.
local json = require 'fsdp.io.json'
local files = require 'fsdp.io.files'

local M = { on = false }

local epoch = require('fsdp.clock').epoch

-- Microseconds since the epoch.
function M.now() return epoch() * 1e6 end

local events, names, device, pid, memory_stats

-- Start recording. opts: model (its modules' spans are named by their
-- path in it), device (the memory counter's; 'cpu'), rank (the pid; 0).
function M.start(opts)
  opts = opts or {}
  events, names = {}, setmetatable({}, { __mode = 'k' })
  if opts.model then
    for _, nm in ipairs(opts.model:named_modules()) do names[nm[2]] = nm[1] == '' and 'model' or nm[1] end
  end
  device, pid = opts.device or 'cpu', opts.rank or 0
  memory_stats = require('fsdp').memory_stats
  events[1] = { name = 'process_name', ph = 'M', pid = pid, tid = 0, args = { name = ('rank %d'):format(pid) } }
  events[2] = { name = 'process_sort_index', ph = 'M', pid = pid, tid = 0, args = { sort_index = pid } }
  events[3] = { name = 'thread_name', ph = 'M', pid = pid, tid = 0, args = { name = 'host' } }
  M.on = true
end

-- A complete span from t0 (M.now() when it began) to now. cat: the
-- category (forward, backward, comm, wait, optim, data, ckpt, step, eval).
function M.span(name, cat, t0, args)
  if not M.on then return end
  local t1 = M.now()
  events[#events + 1] = { name = name, cat = cat, ph = 'X', ts = t0, dur = t1 - t0, pid = pid, tid = 0, args = args }
  local m = memory_stats(device)
  events[#events + 1] = { name = 'memory ' .. device, ph = 'C', ts = t1, pid = pid, tid = 0,
                          args = { in_use_mib = m.in_use / 2 ^ 20 } }
end

-- The name of a module in the model given to start (its class otherwise).
function M.module_name(m)
  return names and names[m] or tostring(rawget(getmetatable(m) or {}, '__name') or 'module')
end

-- fn(...) as a span (its results returned); only fn(...) when off.
function M.call(name, cat, fn, ...)
  if not M.on then return fn(...) end
  local t0 = M.now()
  return M._after(name, cat, t0, fn(...))
end
function M._after(name, cat, t0, ...)
  M.span(name, cat, t0)
  return ...
end

-- Stop and write the trace to path (its directory created). Returns the
-- number of events written.
function M.stop(path)
  if not M.on then return 0 end
  M.on = false
  local dir = files.dirname(path)
  if dir ~= '' then files.mkdir_p(dir, 'fsdp.observe.profiler') end
  local parts = {}
  for i, e in ipairs(events) do parts[i] = json.encode(e) end
  local text = '{"displayTimeUnit":"ms","traceEvents":[\n' .. table.concat(parts, ',\n') .. '\n]}\n'
  files.write_atomic(path, text)
  local n = #events
  events, names = nil, nil
  return n
end

return M
