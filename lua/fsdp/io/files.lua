-- fsdp.io.files: the file-system steps checkpoints and exports are made
-- of: atomic publication of small files (core/io/atomic_file.c: temporary
-- name, fsync, rename, fsync of the directory), durable renames and
-- exchanges (whole directories: fsdp.io.publish), directories, and
-- removal; and how every file a user names is read (regular files only,
-- reads bounded).
--
--   local files = require 'fsdp.io.files'
--   files.write_atomic('ckpt/step-000010/index.json', text)
--   files.mkdir_p('ckpt/step-000010'); files.list('ckpt'); files.remove_tree(dir)
--   local a = files.appender('m.jsonl'); a:write(line); a:close()   -- checked appends
local core = require 'fsdp.core'
local lfs = require 'lfs'
local ffi, C = core.ffi, core.C

pcall(ffi.cdef, 'int gethostname(char *name, size_t len);')

local M = {}

-- This machine's name (gethostname: no shell), '?' when it has none.
function M.hostname()
  local buf = ffi.new('char[256]')
  if ffi.C.gethostname(buf, 255) ~= 0 or buf[0] == 0 then return '?' end
  return ffi.string(buf)
end

function M.mode(path) return lfs.attributes(path, 'mode') end
-- The mode of the entry itself, not of what a symbolic link points to:
-- 'link' for a link (lstat). Removal and pruning ask this, never mode().
function M.lmode(path) return lfs.symlinkattributes(path, 'mode') end
function M.size(path) return lfs.attributes(path, 'size') or 0 end

function M.join(dir, name) return dir:sub(-1) == '/' and dir .. name or dir .. '/' .. name end

function M.dirname(path)
  local d = path:match('^(.*)/[^/]*$')
  if d == nil then return '.' end
  return d == '' and '/' or d
end

-- Replace `path` by a file holding `text`: readers see the old file or the
-- whole new one, never a part.
function M.write_atomic(path, text)
  core.check(C.fl_file_write_atomic(path, text, #text))
end

-- The name a writability probe starts with (fsdp.options creates one in an
-- output directory and removes it at once): one left by a process killed
-- in between is ours, not the user's, wherever it is found.
M.WRITE_PROBE = '.fsdp-lua-write-probe-'
function M.is_write_probe(name) return name:sub(1, #M.WRITE_PROBE) == M.WRITE_PROBE end

-- fsync a file or directory (after entries were created or removed).
function M.fsync(path) core.check(C.fl_fsync_path(path)) end

-- rename(2) made durable (the directories fsynced after).
function M.rename(from, to) core.check(C.fl_rename_durable(from, to)) end

-- Swap two paths on one file system in one atomic step (durable): true,
-- or false and the reason where the file system or kernel cannot
-- (core/io/atomic_file.c); other failures raise.
function M.exchange(a, b)
  local status = C.fl_path_exchange(a, b)
  if status == C.FL_ERR_UNSUPPORTED then return false, core.last_error() end
  core.check(status)
  return true
end

pcall(core.ffi.cdef, 'char *realpath(const char *path, char *resolved);')
local path_buf = core.ffi.new('char[?]', 4097)

-- The absolute path without links, '.' or '..' (realpath(3)) of an
-- existing path; nil when it cannot be resolved.
function M.realpath(path)
  local p = core.ffi.C.realpath(path, path_buf)
  if p == nil then return nil end
  return core.ffi.string(p)
end

-- A file that grows by whole records (core/io/append_file.c): a:write(text)
-- appends all of text or raises naming the file, the bytes written and why,
-- with any part that reached the file cut off again; a:close() raises when
-- the close reports a late write error. create_new: refuse an existing
-- file. Collected unclosed, it is closed quietly.
local Appender = {}
Appender.__index = Appender

function M.appender(path, create_new)
  local h = C.fl_append_open(path, create_new and true or false)
  if h == nil then core.raise() end
  return setmetatable({ h = ffi.gc(h, C.fl_append_close), path = path }, Appender)
end

function Appender:write(text)
  if not self.h then core.fail(('%s: written after it was closed'):format(self.path)) end
  core.check(C.fl_append_write(self.h, text, #text))
end

function Appender:close()
  local h = self.h
  if not h then return end
  self.h = nil
  core.check(C.fl_append_close(ffi.gc(h, nil)))
end

-- [Note: inputs are regular files] (core/io/input_file.c): a FIFO opened
-- for reading waits for a writer, a device never ends, so a file a user
-- names is read only when it is a regular file, and a whole-file read
-- stops at a bound. Readers here go through M.read (the whole file, read
-- by the core: the check and the read are of one descriptor) or
-- M.open_input (checked, then a Lua file for reading line by line);
-- writers through M.check_output.
local MiB = 2 ^ 20
-- What a whole-file read may hold, by kind of file; the error names the
-- kind ("x is larger than 64 MiB, the limit for a JSON file").
M.LIMITS = {
  text = { 64 * MiB, 'a text file' },          -- JSON configs and indexes, small text files
  log = { 1024 * MiB, 'a log file' },          -- metrics JSONL, event files, traces
  data = { 2047 * MiB, 'a data file' },        -- whole data files: the most a Lua string holds
}

-- The whole file as a string: nil and a message naming the file when it
-- cannot be read, is not a regular file (a FIFO, a device, a directory) or
-- holds more than `limit` bytes (default M.LIMITS.text); `what` names the
-- kind of file in that message.
function M.read(path, limit, what)
  if not limit then limit, what = M.LIMITS.text[1], what or M.LIMITS.text[2] end
  local len = ffi.new('size_t[1]')
  local buf = C.fl_file_read_all(path, limit, what, len)
  if buf == nil then return nil, core.last_error() end
  local text = ffi.string(buf, len[0])
  C.fl_file_buffer_free(buf)
  return text
end

-- true when `path` is a regular file; else nil and why, naming it.
function M.check_input(path)
  if C.fl_file_check_regular(path) ~= 0 then return nil, core.last_error() end
  return true
end

-- A Lua file open for reading `path` (mode 'rb' unless given), which must
-- be a regular file; nil and why (naming the file) else.
function M.open_input(path, mode)
  local ok, why = M.check_input(path)
  if not ok then return nil, why end
  local f, err = io.open(path, mode or 'rb')
  if not f then return nil, err end
  return f
end

-- Whether a regular file is at `path` (links followed): true, or false
-- when nothing is. Anything else there where a file is looked for (a FIFO,
-- a device, a directory) raises naming it, rather than reading as absent.
function M.is_file(path)
  local m = M.mode(path)
  if m == 'file' then return true end
  if m == nil then return false end
  local _, why = M.check_input(path)
  error(why, 0)
end

-- true when `path` may be written: absent, a regular file, or a character
-- device the user named on purpose (/dev/null, /dev/stdout, /dev/full);
-- a FIFO would block the writer until a reader came, and a directory, a
-- socket or a block device is no file to write: nil and why.
function M.check_output(path)
  local m = M.mode(path)
  if m == nil or m == 'char device' then return true end
  return M.check_input(path)
end

-- A Lua file open for writing `path` (mode 'w' unless given), which must
-- not be a FIFO, a device or a directory; nil and why else.
function M.open_output(path, mode)
  local ok, why = M.check_output(path)
  if not ok then return nil, why end
  return io.open(path, mode or 'w')
end

-- Create dir and its missing parents; what prefix: names the caller in
-- errors.
function M.mkdir_p(dir, what)
  what = what or 'mkdir'
  local path = dir:sub(1, 1) == '/' and '' or '.'
  for part in dir:gmatch('[^/]+') do
    path = path .. '/' .. part
    if M.mode(path) == nil then
      local ok, err = lfs.mkdir(path)
      if not ok and M.mode(path) ~= 'directory' then
        core.fail(('%s: cannot create directory %s: %s'):format(what, path, tostring(err)))
      end
    elseif M.mode(path) ~= 'directory' then
      core.fail(('%s: %s exists and is not a directory'):format(what, path))
    end
  end
end

-- The entries of a directory (no . and ..), sorted.
function M.list(dir)
  local out = {}
  for name in lfs.dir(dir) do
    if name ~= '.' and name ~= '..' then out[#out + 1] = name end
  end
  table.sort(out)
  return out
end

-- Remove a directory and everything under it; `first` (a name inside it)
-- goes first, so a crash midway leaves a directory without it. A symbolic
-- link is removed as a link: nothing it points to is touched.
function M.remove_tree(dir, first)
  if M.lmode(dir) ~= 'directory' then return end
  if first and M.lmode(M.join(dir, first)) then
    os.remove(M.join(dir, first))
    M.fsync(dir)
  end
  for _, name in ipairs(M.list(dir)) do
    local path = M.join(dir, name)
    if M.lmode(path) == 'directory' then M.remove_tree(path) else os.remove(path) end
  end
  local ok, err = lfs.rmdir(dir)
  if not ok then core.fail(('cannot remove directory %s: %s'):format(dir, tostring(err))) end
end

return M
