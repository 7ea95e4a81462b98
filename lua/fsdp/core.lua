-- fsdp.core: the FFI binding of the C core.
--
-- Loads the declarations the library carries (generated from
-- core/include/fsdp.h at build time, so they always match the binary) and
-- provides the small helpers every other module uses to call C: turning the
-- core's thread-local error into a Lua error, and converting dtype and
-- device names to the core's enums.
--
-- [Note: finding the core library] In fsdp-lua, and in a program that
-- links libfsdp.so (tests/embed/embed.c), the core's symbols are already in
-- the process and ffi.C reaches them. In any other LuaJIT (a stock
-- `luajit`, a program that embeds LuaJIT without linking the core) the
-- library is loaded with ffi.load, from the first of: package.cpath's
-- templates for the name "fsdp" (LUA_CPATH="<root>/build/lib/lib?.so;;"),
-- the build tree beside these sources (<root>/build/lib/libfsdp.so), and
-- the dynamic linker's own search (LD_LIBRARY_PATH, ldconfig). It is
-- loaded with global symbols, so the backend plugins it opens (found
-- beside it) bind to this copy. README.md, "Embedding fsdp-lua".
local ffi = require 'ffi'

local M = {}

ffi.cdef 'const char *fl_ffi_cdef(void);'

-- This file's directory: <root>/lua/fsdp/.
local LIB_DIR = debug.getinfo(1, 'S').source:match('^@(.*)core%.lua$')

local function file_exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() end
  return f ~= nil
end

-- The namespace holding the core's symbols: ffi.C when the process has
-- them, else the library loaded as the Note above says.
local function bind_core()
  if pcall(function() return ffi.C.fl_ffi_cdef end) then return ffi.C end
  local tried = {}
  local candidates = {}
  local from_cpath = package.searchpath('fsdp', package.cpath)
  if from_cpath then candidates[#candidates + 1] = from_cpath end
  for template in package.cpath:gmatch('[^;]+') do
    if template:find('lib?.so', 1, true) then tried[#tried + 1] = template:gsub('%?', 'fsdp') end
  end
  if LIB_DIR then
    local tree = (LIB_DIR == '' and './' or LIB_DIR) .. '../../build/lib/libfsdp.so'
    if file_exists(tree) then candidates[#candidates + 1] = tree end
    tried[#tried + 1] = tree
  end
  candidates[#candidates + 1] = 'fsdp' -- the dynamic linker's search: libfsdp.so
  tried[#tried + 1] = 'libfsdp.so on the dynamic linker\'s path'
  local errors = {}
  for _, path in ipairs(candidates) do
    local ok, lib = pcall(ffi.load, path, true)
    if ok and pcall(function() return lib.fl_ffi_cdef end) then return lib end
    errors[#errors + 1] = tostring(lib)
  end
  error('fsdp: cannot load the core library libfsdp.so (tried ' .. table.concat(tried, ', ')
        .. '; set LUA_CPATH="<root>/build/lib/lib?.so;;" or LD_LIBRARY_PATH): '
        .. table.concat(errors, '; '), 3)
end

local C = bind_core()
ffi.cdef(ffi.string(C.fl_ffi_cdef()))

M.C = C
M.ffi = ffi

-- The text of the core's last error on this thread.
function M.last_error()
  return ffi.string(C.fl_last_error())
end

-- Errors are attributed to the user's code: the first frame on the stack
-- outside this library (LIB_DIR; counting levels by hand breaks on tail
-- calls).

local function user_level()
  -- getinfo level 1 is this function, 2 the helper raising the error; the
  -- helper's error level is one less than the getinfo level.
  local k = 3
  while true do
    local info = debug.getinfo(k, 'S')
    if not info then return 0 end
    if info.what ~= 'C' and not (LIB_DIR and info.source:sub(2, #LIB_DIR + 1) == LIB_DIR) then
      return k - 1
    end
    k = k + 1
  end
end

-- Raise a Lua error with `msg`, positioned at the user's calling line.
function M.fail(msg)
  error(msg, user_level())
end

-- Raise the core's last error.
function M.raise()
  local msg = M.last_error()
  if msg == '' then msg = 'fsdp core call failed (no message)' end
  error(msg, user_level())
end

-- Check an int status from the core; raise on failure.
function M.check(status)
  if status ~= 0 then M.raise() end
end

-- dtype: name <-> enum ----------------------------------------------------

local dtype_cache = {}

-- Accepts a name ('f32', 'float32', 'bf16', ...) or an enum number.
function M.dtype(x)
  if type(x) == 'number' then return x end
  local d = dtype_cache[x]
  if d then return d end
  if type(x) ~= 'string' then
    M.fail(('dtype must be a string such as \'f32\', got %s'):format(type(x)))
  end
  d = C.fl_dtype_parse(x)
  if d < 0 then M.raise() end
  dtype_cache[x] = d
  return d
end

function M.dtype_name(d)
  return ffi.string(C.fl_dtype_name(d))
end

function M.dtype_is_float(d)
  return C.fl_dtype_is_float(d)
end

-- device: name <-> id ------------------------------------------------------

local device_cache = {}
local device_out = ffi.new('fl_device[1]')
local name_buf = ffi.new('char[32]')

function M.device(x)
  if type(x) == 'number' then return x end
  local d = device_cache[x]
  if d then return d end
  if type(x) ~= 'string' then
    M.fail(('device must be a string such as \'cpu\', got %s'):format(type(x)))
  end
  M.check(C.fl_device_parse(x, device_out))
  d = device_out[0]
  device_cache[x] = d
  return d
end

function M.device_name(d)
  M.check(C.fl_device_format(d, name_buf, 32))
  return ffi.string(name_buf)
end

function M.device_kind(d)
  local k = C.fl_device_kind_of(d)
  if k == C.FL_DEVICE_META then return 'meta'
  elseif k == C.FL_DEVICE_CPU then return 'cpu'
  else return 'cuda' end
end

-- shapes: Lua arrays <-> int64_t[] -----------------------------------------

-- A shape given as a table {2, 3} or as numbers 2, 3 (varargs); returns
-- ndim, int64_t[] and the index after the shape (where options may follow).
function M.shape_args(...)
  local first = ...
  local dims, nextarg
  if type(first) == 'table' and getmetatable(first) == nil then
    dims, nextarg = first, 2
  else
    dims, nextarg = {}, 1
    for i = 1, select('#', ...) do
      local v = select(i, ...)
      if type(v) ~= 'number' and not (type(v) == 'cdata' and ffi.istype('int64_t', v)) then break end
      dims[#dims + 1] = v
      nextarg = i + 1
    end
  end
  local n = #dims
  if n > C.FL_MAX_DIMS then
    M.fail(('%d dimensions given, at most %d supported'):format(n, C.FL_MAX_DIMS))
  end
  local arr = ffi.new('int64_t[?]', math.max(n, 1))
  for i = 1, n do
    local v = dims[i]
    if type(v) ~= 'number' and type(v) ~= 'cdata' then
      M.fail(('shape entry %d is a %s, expected an integer'):format(i, type(v)))
    end
    if type(v) == 'number' and v ~= math.floor(v) then
      M.fail(('shape entry %d is %s, expected an integer'):format(i, tostring(v)))
    end
    arr[i - 1] = v
  end
  return n, arr, nextarg
end

-- "[2, 3]" for error messages (the core's own format).
function M.format_shape(shape)
  return '[' .. table.concat(shape, ', ') .. ']'
end

-- The shape of a tensor struct as a Lua array.
function M.shape_table(c)
  local s = {}
  for i = 0, c.ndim - 1 do s[i + 1] = tonumber(c.shape[i]) end
  return s
end

return M
