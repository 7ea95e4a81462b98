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
-- Ops are spans too (category "op", with FLOPs, the bytes, shape and dtype
-- of what they made): in forward, every call of a fsdp.functional function
-- while recording (the table's functions are wrapped from start to stop,
-- so modules, which call them through it, are covered; tensor methods and
-- arithmetic operators are not); in backward, each node the autograd
-- engine runs, timed by the engine (fl_engine_record_spans). They nest
-- inside the module and unit spans, and each adds a sample to the memory
-- counter, so the peak falls at an op (tools/trace_summary.lua names it).
--
-- Instrumented code asks `profiler.on` (one field read) before anything
-- else: with no trace being recorded a module call or a unit's
-- collective costs nothing more. Spans are host time: on a GPU a span is
-- the time to queue the work (device-side timing is not recorded), a
-- "wait" span is where the host blocked on a collective, which on the CPU
-- is the communication not hidden behind compute.
local json = require 'fsdp.io.json'
local files = require 'fsdp.io.files'
local ffi = require 'ffi'
local C = require('fsdp.core').C

-- Backward node spans the engine keeps between two takes (about 100 bytes
-- each): a few steps of a large model's nodes.
local NODE_SPANS = 65536

local M = { on = false }

local epoch = require('fsdp.clock').epoch

-- Microseconds since the epoch.
function M.now() return epoch() * 1e6 end

local events, names, device, pid, memory_stats
local wrapped -- fsdp.functional's own functions while they are wrapped

-- The bytes, shape and dtype of an op's first tensor result.
local function result_args(args, r)
  if type(r) == 'table' and r._c ~= nil then
    args.bytes = r:numel() * tonumber(C.fl_dtype_size(r._c.dtype))
    args.shape = table.concat(r.shape, 'x')
    args.dtype = r.dtype
  end
  return args
end

-- [Note: memory by owner] Beside the bytes in use, each sample on the
-- profiled device splits them the way fsdp.plan's report does: what was
-- in use when recording started, between steps (persistent: shards,
-- gradients, optimizer state, buffers), the sharded units gathered now
-- (gathered units), and the rest, made by the step (activations and
-- transients), on a second counter track, 'memory <device> by owner'.
local units -- the sharded model's units, or nil
local persistent = 0

local function gathered_now()
  local n = 0
  for _, u in ipairs(units or {}) do
    if u:state() ~= 'SHARDED' then n = n + u.gathered_bytes end
  end
  return n
end

-- Gathered bytes over time, sampled where Lua samples memory: units are
-- gathered and freed only in Lua (the sharding hooks), so a backward node
-- the engine timed takes the value of the last sample before its end.
local series_t, series_g = {}, {}
local function gathered_at(t)
  local lo, hi = 1, #series_t -- the last sample at or before t
  if hi == 0 or series_t[1] > t then return 0 end
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if series_t[mid] <= t then lo = mid else hi = mid - 1 end
  end
  return series_g[lo]
end

-- The memory counter's samples at t (the device's bytes in use); live:
-- sampled now, in Lua (else a backward node's, taken afterwards).
local function counter(t, dev, in_use, live)
  events[#events + 1] = { name = 'memory ' .. dev, ph = 'C', ts = t, pid = pid, tid = 0,
                          args = { in_use_mib = in_use / 2 ^ 20 } }
  if dev ~= device then return end
  local g
  if live then
    g = gathered_now()
    series_t[#series_t + 1], series_g[#series_g + 1] = t, g
  else
    g = gathered_at(t)
  end
  events[#events + 1] = { name = 'memory ' .. dev .. ' by owner', ph = 'C', ts = t, pid = pid, tid = 0,
                          args = { persistent = persistent / 2 ^ 20, ['gathered units'] = g / 2 ^ 20,
                                   ['activations and transients'] = math.max(0, in_use - persistent - g) / 2 ^ 20 } }
end

local function op_span(name, t0, f0, ...)
  if M.on then
    local t1 = M.now()
    events[#events + 1] = { name = name, cat = 'op', ph = 'X', ts = t0, dur = t1 - t0, pid = pid, tid = 0,
                            args = result_args({ flops = tonumber(C.fl_flops() - f0) }, (...)) }
    counter(t1, device, memory_stats(device).in_use, true)
  end
  return ...
end

local function wrap_functional()
  local F = require 'fsdp.functional'
  wrapped = {}
  for k, f in pairs(F) do
    if type(f) == 'function' then
      wrapped[k] = f
      local name = 'F.' .. k
      F[k] = function(...) return op_span(name, M.now(), C.fl_flops(), f(...)) end
    end
  end
end

local function unwrap_functional()
  local F = require 'fsdp.functional'
  for k, f in pairs(wrapped or {}) do F[k] = f end
  wrapped = nil
end

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
  units = opts.model and rawget(opts.model, '_fsdp') and require('fsdp.sharding').units(opts.model) or nil
  persistent = memory_stats(device).in_use
  series_t, series_g = {}, {}
  events[1] = { name = 'process_name', ph = 'M', pid = pid, tid = 0, args = { name = ('rank %d'):format(pid) } }
  events[2] = { name = 'process_sort_index', ph = 'M', pid = pid, tid = 0, args = { sort_index = pid } }
  events[3] = { name = 'thread_name', ph = 'M', pid = pid, tid = 0, args = { name = 'host' } }
  require('fsdp.core').check(C.fl_engine_record_spans(NODE_SPANS))
  wrap_functional()
  M.on = true
end

-- The backward nodes the engine timed since the last take, as op spans;
-- returns how many were lost to a full buffer.
local function take_node_spans()
  local buf = ffi.new('fl_node_span[?]', 1024)
  local lost = ffi.new('int64_t[1]')
  local dropped = 0
  while true do
    local n = C.fl_engine_take_spans(buf, 1024, lost)
    dropped = dropped + tonumber(lost[0])
    for i = 0, n - 1 do
      local sp = buf[i]
      local shape = {}
      for d = 0, sp.ndim - 1 do shape[#shape + 1] = tostring(tonumber(sp.shape[d])) end
      events[#events + 1] = {
        name = ffi.string(sp.name), cat = 'op', ph = 'X', ts = sp.start_us, dur = sp.duration_us, pid = pid,
        tid = 0, args = { flops = tonumber(sp.flops), bytes = tonumber(sp.bytes),
                          shape = table.concat(shape, 'x'),
                          dtype = ffi.string(C.fl_dtype_name(sp.dtype)) },
      }
      counter(sp.start_us + sp.duration_us, require('fsdp.core').device_name(sp.device), tonumber(sp.in_use))
    end
    if n < 1024 then return dropped end
  end
end

-- A complete span from t0 (M.now() when it began) to now. cat: the
-- category (forward, backward, comm, wait, optim, data, ckpt, step, eval).
function M.span(name, cat, t0, args)
  if not M.on then return end
  local t1 = M.now()
  events[#events + 1] = { name = name, cat = cat, ph = 'X', ts = t0, dur = t1 - t0, pid = pid, tid = 0, args = args }
  counter(t1, device, memory_stats(device).in_use, true)
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
  unwrap_functional()
  local dropped = take_node_spans()
  C.fl_engine_record_spans(0)
  if dropped > 0 then
    events[#events + 1] = { name = 'dropped backward op spans', ph = 'M', pid = pid, tid = 0,
                            args = { count = dropped, capacity = NODE_SPANS } }
  end
  local dir = files.dirname(path)
  if dir ~= '' then files.mkdir_p(dir, 'fsdp.observe.profiler') end
  local parts = {}
  for i, e in ipairs(events) do parts[i] = json.encode(e) end
  local text = '{"displayTimeUnit":"ms","traceEvents":[\n' .. table.concat(parts, ',\n') .. '\n]}\n'
  files.write_atomic(path, text)
  local n = #events
  events, names, units = nil, nil, nil
  return n
end

return M
