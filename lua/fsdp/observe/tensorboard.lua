-- fsdp.observe.tensorboard: TensorBoard event files, written by hand (no
-- TensorFlow, no protobuf library): scalars and text summaries that
-- `tensorboard --logdir DIR` shows.
--
--   local tb = require 'fsdp.observe.tensorboard'
--   local w = tb.Writer('runs/a')                 -- a new events.out.tfevents.* file in runs/a
--   w:text('config', 'lr = 3e-4 ...', 0)
--   w:scalars(10, { { 'train/loss', 2.31 }, { 'train/lr', 3e-4 } })
--   w:close()
--   tb.truncate_after('runs/a', 40)               -- a resume at step 40: later events dropped
--   tb.read(path)                                  -- the events of one file (tests, truncation)
--
-- [Note: the tfevents format]
-- A file is a sequence of records: uint64 length (little-endian), uint32
-- masked CRC-32C of those 8 bytes, the data, uint32 masked CRC-32C of the
-- data; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. The data is a
-- tensorflow.Event protobuf: wall_time (1, double), step (2, int64),
-- file_version (3, string; the first record says "brain.Event:2"),
-- summary (5): Summary.value (1, repeated): tag (1), simple_value (2,
-- float) or, for text, metadata (9) {plugin_data (1) {plugin_name (1) =
-- "text"}} and tensor (8) {dtype (1) = DT_STRING (7), tensor_shape (2)
-- {}, string_val (8)}. Only these fields are written; the protobuf
-- encoding of a handful of fields is a few lines, below.
--
-- Resume: a run writes a new file each time it starts; when it resumes at
-- step S, truncate_after(dir, S) cuts every earlier file of the directory
-- at its first event past S (records are appended in step order), so each
-- step's values appear once. The CRC is fl_crc32c (core/io/crc32c.c).
local ffi = require 'ffi'
local bit = require 'bit'
local core = require 'fsdp.core'
local files = require 'fsdp.io.files'
local C = core.C

local M = {}

ffi.cdef [[
  int getpid(void);
  int truncate(const char *path, long length);
]]
pcall(ffi.cdef, 'char *strerror(int errnum);')

-- Seconds since the epoch (TensorBoard's wall_time).
local wall_time = require('fsdp.clock').epoch

-- protobuf encoding ----------------------------------------------------------

local function varint(n)
  -- n >= 0, an integer below 2^53 (steps)
  local out = {}
  repeat
    local low = n % 128
    n = (n - low) / 128
    out[#out + 1] = string.char(n > 0 and low + 128 or low)
  until n == 0
  return table.concat(out)
end

local function key(field, wire) return varint(field * 8 + wire) end
local function bytes_field(field, s) return key(field, 2) .. varint(#s) .. s end

local scratch = ffi.new('union { double d; float f; uint32_t u; uint8_t b[8]; }')
local function double_field(field, x)
  scratch.d = x
  return key(field, 1) .. ffi.string(scratch.b, 8)
end
local function float_field(field, x)
  scratch.f = x
  return key(field, 5) .. ffi.string(scratch.b, 4)
end

local function u32le(u)
  scratch.u = u
  return ffi.string(scratch.b, 4)
end
local function u64le(n)
  return u32le(n % 2^32) .. u32le(math.floor(n / 2^32))
end

-- The Event message: wall_time, step, then file_version or summary.
local function event(step, body, t)
  return double_field(1, t or wall_time()) .. key(2, 0) .. varint(step) .. body
end

local function scalar_value(tag, x) return bytes_field(1, bytes_field(1, tag) .. float_field(2, x)) end

local function text_value(tag, text)
  local metadata = bytes_field(1, bytes_field(1, 'text'))
  local tensor = key(1, 0) .. varint(7) .. bytes_field(2, '') .. bytes_field(8, text)
  return bytes_field(1, bytes_field(1, tag) .. bytes_field(9, metadata) .. bytes_field(8, tensor))
end

-- records ----------------------------------------------------------------------

local function masked_crc(s)
  local c = C.fl_crc32c(0, s, #s)
  local rotated = bit.bor(bit.rshift(c, 15), bit.lshift(c, 17))
  return bit.tobit(rotated + 0xa282ead8) % 2^32
end

-- The bytes of one record holding `data` (an encoded Event).
function M.record(data)
  local len = u64le(#data)
  return len .. u32le(masked_crc(len)) .. data .. u32le(masked_crc(data))
end

-- writer ------------------------------------------------------------------------

local Writer = {}
Writer.__index = Writer

local function hostname()
  local name = files.hostname()
  return (name == '?' and 'localhost' or name):gsub('[^%w%.%-_]', '_')
end

-- A new event file in dir (created with its parents), named as
-- TensorBoard's own writers name theirs so it sorts by start time:
-- events.out.tfevents.<seconds>.<host>.<pid>[.<n>]. opts.wall_time: a
-- function giving the time of each event (tests).
function M.Writer(dir, opts)
  opts = opts or {}
  files.mkdir_p(dir, 'fsdp.observe.tensorboard')
  local now = opts.wall_time or wall_time
  local base = files.join(dir, ('events.out.tfevents.%010d.%s.%d'):format(math.floor(now()), hostname(),
    ffi.C.getpid()))
  local path, n = base, 0
  while files.mode(path) do n = n + 1; path = base .. '.' .. n end
  local ok, f = pcall(files.appender, path, true)
  if not ok then core.fail(('fsdp.tensorboard: cannot create %s'):format(tostring(f):gsub('^[^%s:]+:%d+: ', ''))) end
  local self = setmetatable({ file = f, path = path, now = now }, Writer)
  self:_put(event(0, bytes_field(3, 'brain.Event:2'), now()))
  return self
end

-- One record, one checked write (fsdp.io.files.appender): a failure raises
-- naming the file, and the file still ends with a whole record, which
-- TensorBoard and read() need.
function Writer:_put(data)
  if not self.file then core.fail(('fsdp.tensorboard: %s: written after close'):format(self.path)) end
  local ok, err = pcall(self.file.write, self.file, M.record(data))
  if not ok then core.fail('fsdp.tensorboard: ' .. tostring(err):gsub('^[^%s:]+:%d+: ', '')) end
end

-- One event at `step` holding scalars: values is a list of {tag, number}
-- (written in that order); nil numbers are left out, non-finite ones kept
-- (TensorBoard draws NaN and infinity).
function Writer:scalars(step, values)
  local parts = {}
  for _, v in ipairs(values) do
    if v[2] ~= nil then parts[#parts + 1] = scalar_value(v[1], v[2]) end
  end
  if #parts > 0 then self:_put(event(step, bytes_field(5, table.concat(parts)), self.now())) end
end

-- A text summary (shown under TEXT; markdown) at `step`.
function Writer:text(tag, text, step)
  self:_put(event(step or 0, bytes_field(5, text_value(tag, text)), self.now()))
end

-- Close the file; raises when the close reports a late write error.
function Writer:close()
  local f = self.file
  if not f then return end
  self.file = nil
  local ok, err = pcall(f.close, f)
  if not ok then core.fail('fsdp.tensorboard: ' .. tostring(err):gsub('^[^%s:]+:%d+: ', '')) end
end

-- reading ----------------------------------------------------------------------

-- A reader of the fields written above: returns a table of field number ->
-- list of values (varint numbers, 8/4-byte strings, length-delimited strings).
local function fields(s)
  local out, i = {}, 1
  local function read_varint()
    local n, mul = 0, 1
    while true do
      local b = s:byte(i)
      if not b then error('truncated varint', 0) end
      i = i + 1
      n = n + (b % 128) * mul
      mul = mul * 128
      if b < 128 then return n end
    end
  end
  while i <= #s do
    local k = read_varint()
    local field, wire = math.floor(k / 8), k % 8
    local v
    if wire == 0 then v = read_varint()
    elseif wire == 1 then v = s:sub(i, i + 7); i = i + 8
    elseif wire == 5 then v = s:sub(i, i + 3); i = i + 4
    elseif wire == 2 then local n = read_varint(); v = s:sub(i, i + n - 1); i = i + n
    else error(('unsupported wire type %d'):format(wire), 0) end
    out[field] = out[field] or {}
    table.insert(out[field], v)
  end
  return out
end

local function as_double(b) ffi.copy(scratch.b, b, 8); return scratch.d end
local function as_float(b) ffi.copy(scratch.b, b, 4); return scratch.f end

-- The events of an event file as a list of {wall_time, step,
-- file_version, values = {{tag =, value = | text =}}, offset = the byte
-- where its record starts}, checking every CRC. Fails naming the file and
-- offset of a damaged record.
function M.read(path)
  local s, err = files.read(path, files.LIMITS.log[1], 'an event file')
  if not s then core.fail(('fsdp.tensorboard: cannot read %s: %s'):format(path, err)) end
  local events, i = {}, 1
  local function bad(why) core.fail(('fsdp.tensorboard: %s: record at byte %d: %s'):format(path, i - 1, why)) end
  while i <= #s do
    if i + 11 > #s then bad('truncated header') end
    local head = s:sub(i, i + 7)
    if s:sub(i + 8, i + 11) ~= u32le(masked_crc(head)) then bad('length CRC mismatch') end
    local b = { head:byte(1, 8) }
    local n = 0
    for k = 8, 1, -1 do n = n * 256 + b[k] end
    local data = s:sub(i + 12, i + 11 + n)
    if #data ~= n or s:sub(i + 12 + n, i + 15 + n) ~= u32le(masked_crc(data)) then bad('data CRC mismatch') end
    local f = fields(data)
    local e = { offset = i - 1, wall_time = f[1] and as_double(f[1][1]), step = f[2] and f[2][1] or 0,
                file_version = f[3] and f[3][1], values = {} }
    for _, summary in ipairs(f[5] or {}) do
      for _, v in ipairs(fields(summary)[1] or {}) do
        local vf = fields(v)
        local value = { tag = vf[1] and vf[1][1] }
        if vf[2] then value.value = as_float(vf[2][1]) end
        if vf[8] then value.text = (fields(vf[8][1])[8] or {})[1] end
        e.values[#e.values + 1] = value
      end
    end
    events[#events + 1] = e
    i = i + 16 + n
  end
  return events
end

-- The event files of dir, oldest first (their names start with the time).
function M.files(dir)
  local out = {}
  if files.mode(dir) ~= 'directory' then return out end
  for _, name in ipairs(files.list(dir)) do
    if name:match('^events%.out%.tfevents%.') then out[#out + 1] = files.join(dir, name) end
  end
  table.sort(out)
  return out
end

-- A resume at `step`: cut every event file of dir before its first event
-- past step (a killed run wrote them; the resumed run writes those steps
-- again). Returns the number of events dropped.
function M.truncate_after(dir, step)
  local dropped = 0
  for _, path in ipairs(M.files(dir)) do
    local events = M.read(path)
    for k, e in ipairs(events) do
      if e.step > step then
        dropped = dropped + #events - k + 1
        if ffi.C.truncate(path, e.offset) ~= 0 then
          core.fail(('fsdp.tensorboard: cannot truncate %s: %s'):format(path, ffi.string(ffi.C.strerror(ffi.errno()))))
        end
        break
      end
    end
  end
  return dropped
end

return M
