-- fsdp.io.files: the file-system steps checkpoints and exports are made
-- of: atomic publication of small files (core/io/atomic_file.c: temporary
-- name, fsync, rename, fsync of the directory), durable renames and
-- exchanges (whole directories: fsdp.io.publish), directories, and removal.
--
--   local files = require 'fsdp.io.files'
--   files.write_atomic('ckpt/step-000010/index.json', text)
--   files.mkdir_p('ckpt/step-000010'); files.list('ckpt'); files.remove_tree(dir)
local core = require 'fsdp.core'
local lfs = require 'lfs'
local C = core.C

local M = {}

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

-- The whole file as a string; nil and a message when it cannot be read.
function M.read(path)
  local f, err = io.open(path, 'rb')
  if not f then return nil, err end
  local text = f:read('*a')
  f:close()
  return text
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
