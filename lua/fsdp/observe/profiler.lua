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
-- ("F.linear"), a tensor method that computes ("Tensor.matmul", not
-- size or numel) or an arithmetic operator ("Tensor.__add") while
-- recording (those tables' functions are wrapped from start to stop, so
-- code that calls them through the tables, as modules do, is covered;
-- an op made of others holds their spans); in backward, each node the
-- autograd engine runs, timed by the engine (fl_engine_record_spans). They nest
-- inside the module and unit spans, and each adds a sample to the memory
-- counter, so the peak falls at an op (tools/trace_summary.lua names it).
--
-- Modules and sharded units sit below this file: they report their spans
-- to fsdp.spans, to which start subscribes (stop unsubscribes), and ask
-- `spans.on` (one field read) before anything else: with no trace being
-- recorded a module call or a unit's collective costs nothing more. Spans on the host track are host time:
-- on a GPU a span is the time to queue the work, a "wait" span is where
-- the host blocked on a collective, which on the CPU is the communication
-- not hidden behind compute.
--
-- [Note: device time] On a device with a queue (cuda), each op also gets
-- a span on a second track, '<device> (device time)': timing events
-- recorded on the device before and after it (by the functional wrapper
-- in forward, by the engine around each backward node), read when the
-- trace stops. Its start is the host time of a reference event recorded
-- when recording began plus the device's time from that event, so the
-- device track lines up with the host's (to the reference's own queueing
-- delay, nothing when the queue was empty). tools/trace_summary.lua
-- lists the ops by device time when the trace has them.
local json = require 'fsdp.io.json'
local files = require 'fsdp.io.files'
local spans = require 'fsdp.spans'
local ffi = require 'ffi'
local core = require 'fsdp.core'
local C = core.C
local fsdp = require 'fsdp' -- memory_stats
local F = require 'fsdp.functional'
local sharding = require 'fsdp.sharding'

-- Backward node spans the engine keeps between two takes (about 100 bytes
-- each): a few steps of a large model's nodes.
local NODE_SPANS = 65536

local M = { on = false }

local epoch = require('fsdp.clock').epoch

-- Microseconds since the epoch.
function M.now() return epoch() * 1e6 end -- (fsdp.spans.now: the same clock)

local events, names, device, pid, memory_stats
local wrapped -- the op tables' own functions while they are wrapped

-- Device time ([Note: device time]): the reference event and its host
-- time, and the ops' event pairs waiting to be read at stop.
local timed -- { ref =, ref_us =, pending = {{name, start, stop, args}...} } on cuda, else nil

-- A timing event recorded now on the profiled device (nil on the CPU).
local function device_mark()
  if not timed then return nil end
  local e = C.fl_event_new(timed.dev, true)
  if e ~= nil and C.fl_event_record(e) == 0 then return e end
  if e ~= nil then C.fl_event_free(e) end
  C.fl_clear_error()
  return nil
end

local ms_out = ffi.new('double[1]')
local function elapsed_us(a, b)
  if C.fl_event_elapsed_ms(a, b, ms_out) ~= 0 then
    C.fl_clear_error()
    return nil
  end
  return ms_out[0] * 1e3
end

-- The device spans of the pending event pairs (freeing the events).
local function read_device_spans()
  if not timed then return end
  C.fl_device_synchronize(timed.dev)
  local track = 1
  for _, p in ipairs(timed.pending) do
    local from, dur = elapsed_us(timed.ref, p[2]), elapsed_us(p[2], p[3])
    if from and dur then
      events[#events + 1] = { name = p[1], cat = 'device', ph = 'X', ts = timed.ref_us + from, dur = dur,
                              pid = pid, tid = track, args = p[4] }
    end
    C.fl_event_free(p[2])
    C.fl_event_free(p[3])
  end
  C.fl_event_free(timed.ref)
  timed = nil
end

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

local function op_span(name, t0, f0, e0, ...)
  if M.on then
    local t1 = M.now()
    local args = result_args({ flops = tonumber(C.fl_flops() - f0) }, (...))
    events[#events + 1] = { name = name, cat = 'op', ph = 'X', ts = t0, dur = t1 - t0, pid = pid, tid = 0,
                            args = args }
    counter(t1, device, memory_stats(device).in_use, true)
    local e1 = e0 and device_mark()
    if e1 then
      timed.pending[#timed.pending + 1] = { name, e0, e1, args }
    elseif e0 then
      C.fl_event_free(e0)
    end
  end
  return ...
end

-- Tensor methods that compute nothing: not ops.
local NOT_OPS = {
  backward = true, dim = true, element_size = true, free = true, get = true, has_storage = true, item = true,
  nelement = true, numel = true, size = true, storage_bytes = true, storage_offset = true, stride = true,
  tolist = true, totable = true, requires_grad_ = true, set = true,
}
local OPERATORS = { '__add', '__sub', '__mul', '__div', '__pow', '__unm' }

-- The tables whose functions are ops, and how their spans are named.
local function op_tables()
  local Tensor = getmetatable(fsdp.ones({}))
  local methods, operators = {}, {}
  for k, f in pairs(Tensor.methods) do
    if type(f) == 'function' and not NOT_OPS[k] and not k:match('^is_') then methods[k] = true end
  end
  for _, k in ipairs(OPERATORS) do operators[k] = true end
  return { { F, 'F.' }, { Tensor.methods, 'Tensor.', methods },
           { Tensor, 'Tensor.', operators } }
end

local function wrap_ops()
  wrapped = {}
  for _, entry in ipairs(op_tables()) do
    local tbl, prefix, only = entry[1], entry[2], entry[3]
    local originals = {}
    for k, f in pairs(tbl) do
      if type(f) == 'function' and (not only or only[k]) then
        originals[k] = f
        local name = prefix .. k
        tbl[k] = function(...)
          local t0, f0, e0 = M.now(), C.fl_flops(), device_mark()
          return op_span(name, t0, f0, e0, f(...))
        end
      end
    end
    wrapped[#wrapped + 1] = { tbl, originals }
  end
end

local function unwrap_ops()
  for _, w in ipairs(wrapped or {}) do
    for k, f in pairs(w[2]) do w[1][k] = f end
  end
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
  memory_stats = fsdp.memory_stats
  units = opts.model and rawget(opts.model, '_fsdp') and sharding.units(opts.model) or nil
  persistent = memory_stats(device).in_use
  series_t, series_g = {}, {}
  events[1] = { name = 'process_name', ph = 'M', pid = pid, tid = 0, args = { name = ('rank %d'):format(pid) } }
  events[2] = { name = 'process_sort_index', ph = 'M', pid = pid, tid = 0, args = { sort_index = pid } }
  events[3] = { name = 'thread_name', ph = 'M', pid = pid, tid = 0, args = { name = 'host' } }
  local dev = core.device(device)
  if C.fl_device_kind_of(dev) == C.FL_DEVICE_CUDA then
    timed = { dev = dev, pending = {} }
    timed.ref = device_mark()
    timed.ref_us = M.now()
    if not timed.ref then timed = nil end
    events[4] = { name = 'thread_name', ph = 'M', pid = pid, tid = 1, args = { name = device .. ' (device time)' } }
  end
  core.check(C.fl_engine_record_spans(NODE_SPANS))
  wrap_ops()
  M.on = true
  spans.subscribe(M.span, M.module_name)
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
      local args = { flops = tonumber(sp.flops), bytes = tonumber(sp.bytes), shape = table.concat(shape, 'x'),
                     dtype = ffi.string(C.fl_dtype_name(sp.dtype)) }
      events[#events + 1] = {
        name = ffi.string(sp.name), cat = 'op', ph = 'X', ts = sp.start_us, dur = sp.duration_us, pid = pid,
        tid = 0, args = args,
      }
      if sp.device_start ~= nil then
        if timed then
          timed.pending[#timed.pending + 1] = { ffi.string(sp.name), sp.device_start, sp.device_end, args }
        else
          C.fl_event_free(sp.device_start)
          C.fl_event_free(sp.device_end)
        end
      end
      counter(sp.start_us + sp.duration_us, core.device_name(sp.device), tonumber(sp.in_use))
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

-- Stop and write the trace to path (its directory created), whole or not
-- at all (fsdp.io.files.write_atomic: a failed write raises naming the
-- file and leaves no part of it). Returns the number of events written.
function M.stop(path)
  if not M.on then return 0 end
  M.on = false
  spans.subscribe(nil)
  unwrap_ops()
  local dropped = take_node_spans()
  C.fl_engine_record_spans(0)
  read_device_spans()
  if dropped > 0 then
    events[#events + 1] = { name = 'dropped backward op spans', ph = 'M', pid = pid, tid = 0,
                            args = { count = dropped, capacity = NODE_SPANS } }
  end
  local parts = {}
  for i, e in ipairs(events) do parts[i] = json.encode(e) end
  local text = '{"displayTimeUnit":"ms","traceEvents":[\n' .. table.concat(parts, ',\n') .. '\n]}\n'
  local n = #events
  -- stopped whatever the write does next
  events, names, units = nil, nil, nil
  local dir = files.dirname(path)
  if dir ~= '' then files.mkdir_p(dir, 'fsdp.observe.profiler') end
  files.write_atomic(path, text)
  return n
end

return M
