-- fsdp.io.publish: a directory of several files (a Hugging Face export, a
-- PEFT adapter, a sharded safetensors save) published as a whole, so that
-- a reader finds the previous directory or the whole new one, never a mix
-- of the two and never a half-written one under the final name.
--
--   local publish = require 'fsdp.io.publish'
--   local stage = publish.begin('out/llama')  -- raises when out/llama is not ours to replace
--   -- write every file into stage.dir; safetensors files and the index carry
--   -- stage.id in their metadata under publish.ID_KEY
--   stage:commit()                            -- stage:abort() on a failure
--
--   publish.check('out/llama')    -- loaders: raises on an unfinished or mixed export
--   publish.problem('out/llama')  -- option checks: why it cannot be replaced, or nil
--
-- [Note: exports are published whole]
-- A directory NAME the project writes as a whole is built in a sibling
-- `.NAME.partial-HOST-PID-START` (the same file system, so it can be renamed),
-- which holds MANIFEST (fsdp_export.json, state "writing") from its first
-- moment. Each file is published atomically and fsynced as it is written
-- (core/io/atomic_file.c); the manifest is rewritten last as "complete",
-- listing the files and an id that every weight file and the index carry.
-- Then the sibling and NAME are exchanged in one step (renameat2
-- RENAME_EXCHANGE: NAME is the old directory or the new one, never
-- missing), or renamed onto a missing NAME, and the old one is marked
-- "discarded" and removed. Where the file system cannot exchange, NAME is
-- renamed aside to `.NAME.old-HOST-PID-START` first: a crash between the two
-- renames leaves NAME missing and the old export whole beside it, which
-- loaders name (moved_aside).
--   Loaders (fsdp.io.safetensors_sharded's open_checkpoint, models/hf.lua,
-- models/pretrained.lua) call check(): a manifest that is not "complete"
-- is refused naming the directory, a listed file that is missing and a
-- weight file or index whose id is not the manifest's (files of two
-- exports) too, and so is a sibling of ours by its name, complete or not
-- (the message says what to load or how to restore it). A directory
-- without a manifest (written by transformers or PEFT) loads as before:
-- the manifest is what makes a directory ours.
--   Only what is ours is replaced or removed: NAME must be missing, empty,
-- or a complete export of ours holding nothing but the files its manifest
-- lists; anything else is refused naming the first other entry (a user's
-- notes, an earlier export without a manifest). The old directory is
-- checked again after the swap, and kept (and named) if a file appeared
-- in it meanwhile. The next publication to NAME puts back an old one
-- moved aside when NAME is missing, then removes the leftover siblings of
-- processes that are gone (same host; others are left alone).
--   Siblings are named after the process that made them: HOST (the host
-- name, '-' and other signs made '_'), PID, and START, the process's start
-- time (field 22 of /proc/PID/stat: clock ticks since boot). A pid alone
-- does not say a process is gone: pids are reused (pid_max is 32768 on
-- many machines), and a killed export's pid taken by an unrelated process
-- kept its leftovers forever. So a sibling is of a running process only
-- when a process PID exists, is not a zombie, and started at START. The
-- kinds: `partial` (the new export being written), `old` (the previous
-- one moved aside) and `probe` (the empty directory problem() creates and
-- removes at once to see that the parent takes entries). Without /proc
-- (START unknown) siblings are named `.NAME.KIND-HOST-PID` and judged by
-- the pid alone, as are siblings of that form an earlier version left.
local core = require 'fsdp.core'
local files = require 'fsdp.io.files'
local json = require 'fsdp.io.json'
local lfs = require 'lfs'
local st_file = require 'fsdp.io.safetensors_file'
local ffi = core.ffi

local M = {}

M.MANIFEST = 'fsdp_export.json'
M.ID_KEY = 'fsdp_export_id'
local FORMAT = 'fsdp-lua export'

pcall(ffi.cdef, 'int kill(int pid, int sig);')
pcall(ffi.cdef, 'int gethostname(char *name, size_t len);')
pcall(ffi.cdef, 'int getpid(void);')

local function fail(fmt, ...) core.fail(fmt:format(...)) end

local function hostname()
  local buf = ffi.new('char[256]')
  if ffi.C.gethostname(buf, 255) ~= 0 then return 'localhost' end
  -- '-' separates the pid in sibling names; the host keeps letters.
  return (ffi.string(buf):gsub('[^%w%.]', '_'))
end
local HOST = hostname()

local function pid() return tonumber(ffi.C.getpid()) end

-- /proc/P/stat of process p (a pid or 'self'): its state (field 3) and
-- start time (field 22, clock ticks since boot, as digits), or nil where
-- it cannot be read (no such process, no /proc).
local function proc_stat(p)
  local f = io.open(('/proc/%s/stat'):format(p), 'rb')
  if not f then return nil end
  local text = f:read('*a')
  f:close()
  -- Field 2, the command in parentheses, may hold spaces and ')': the
  -- fields are counted from the last ')'.
  local rest = text and text:match('^.*%)%s+(.*)$')
  if not rest then return nil end
  local state, start, i = nil, nil, 2
  for field in rest:gmatch('%S+') do
    i = i + 1
    if i == 3 then state = field end
    if i == 22 then start = field:match('^%d+$') break end
  end
  if not start then return nil end
  return state, start
end

-- This process's start time (nil without /proc), read again after a fork.
local own = {}
local function own_start()
  local p = pid()
  if own.pid ~= p then
    own.pid, own.start = p, select(2, proc_stat(p))
  end
  return own.start
end

-- Test hooks (tests/chaos/export_kill.lua): FSDP_TEST_KILL_IN_PUBLISH=POINT
-- kills this process with SIGKILL at POINT of a commit: complete (the
-- manifest is complete, nothing swapped yet), aside (the two-rename path:
-- the old directory renamed aside, the new one not in), swapped (the new
-- one in place, the old not yet removed), discarding (the old one marked
-- discarded, its files not yet removed). FSDP_TEST_NO_EXCHANGE takes the
-- two-rename path where the file system could exchange.
local KILL_AT = os.getenv('FSDP_TEST_KILL_IN_PUBLISH')
local function test_point(name)
  if KILL_AT == name then ffi.C.kill(pid(), 9) end
end

-- Whether the process that named a sibling, p started at `start` (nil:
-- not recorded), still runs on this host. A process p that started at
-- another time has only reused the pid; a zombie runs no more.
local function alive(p, start)
  if start then
    local state, now = proc_stat(p)
    if now then return now == start and state ~= 'Z' and state ~= 'X' end
    -- Not readable: gone, or /proc is missing or hides the processes of
    -- other users; kill() answers for the pid alone.
  end
  if ffi.C.kill(p, 0) == 0 then return true end
  return ffi.errno() == 1 -- EPERM: it runs, as another user
end

-- The parts of `KIND-HOST-PID-START` or `KIND-HOST-PID` (the older form,
-- and the form without /proc): kind, host, pid (a number), start (digits,
-- or nil). nil when s is neither.
local function parse_tag(s)
  local kind, host, p, start = s:match('^(%a+)%-([%w%._]+)%-(%d+)%-(%d+)$')
  if not kind then kind, host, p = s:match('^(%a+)%-([%w%._]+)%-(%d+)$') end
  if not kind then return nil end
  return kind, host, tonumber(p), start
end

-- 16 hex digits from the kernel's random source.
local function new_id()
  local f = io.open('/dev/urandom', 'rb')
  local bytes = f and f:read(8)
  if f then f:close() end
  if not bytes or #bytes ~= 8 then
    bytes = tostring(os.time()) .. tostring(pid()) .. tostring({}) -- no /dev/urandom: unique enough locally
  end
  return (bytes:sub(1, 8):gsub('.', function(c) return ('%02x'):format(c:byte()) end))
end

-- The manifest of dir: nil when there is none, the table when it is ours,
-- else raises naming it.
local function read_manifest(dir)
  local path = files.join(dir, M.MANIFEST)
  if files.lmode(path) == nil then return nil end
  local text, err = files.read(path)
  if not text then fail('%s cannot be read: %s', path, tostring(err)) end
  local m = json.decode(text)
  if type(m) ~= 'table' or m.format ~= FORMAT or type(m.state) ~= 'string' or type(m.id) ~= 'string' then
    fail('%s is not an fsdp-lua export manifest (format "%s", a state and an id)', path, FORMAT)
  end
  if m.state == 'complete' and (type(m.files) ~= 'table' or type(m.tagged) ~= 'table') then
    fail('%s is complete but lists no files', path)
  end
  return m
end

local function write_manifest(dir, m)
  m.format = FORMAT
  files.write_atomic(files.join(dir, M.MANIFEST), json.encode(m))
end

-- The path to operate on for dir (links resolved, so a link to an export
-- keeps pointing at the new one), its parent and its last name.
local function target(dir)
  if type(dir) ~= 'string' or dir == '' then fail('publish: the directory must be a path') end
  local path = dir:gsub('/+$', '')
  local real = files.realpath(path == '' and '/' or path)
  if not real then
    local parent = files.realpath(files.dirname(path))
    if not parent then fail('%s: its parent directory %s does not exist', dir, files.dirname(path)) end
    real = files.join(parent, path:match('[^/]+$'))
  end
  local base = real:match('[^/]+$')
  if not base then fail('%s is the root directory: an export replaces its directory as a whole', dir) end
  return real, files.dirname(real), base
end

-- Our sibling of parent/base of `kind` (see the Note for the name).
local function sibling(parent, base, kind)
  local start = own_start()
  return files.join(parent, ('.%s.%s-%s-%d%s'):format(base, kind, HOST, pid(), start and '-' .. start or ''))
end

-- The entries of dir that a publication did not write (the manifest and
-- the files it lists), for a complete manifest m.
local MANIFEST_TMP = '^' .. M.MANIFEST:gsub('%.', '%%.') .. '%.tmp%.%d+$'
local function foreign_entries(dir, m)
  local listed = { [M.MANIFEST] = true }
  for _, n in ipairs(m.files) do listed[n] = true end
  local out = {}
  for _, n in ipairs(files.list(dir)) do
    -- (the temporary file of a manifest being rewritten: a process killed
    -- while discarding a complete export leaves one beside the manifest)
    if not listed[n] and not files.is_write_probe(n) and not n:find(MANIFEST_TMP) then out[#out + 1] = n end
  end
  return out
end

-- Why the existing path real (given as `name`) cannot be replaced by a
-- publication, or nil.
local function replace_problem(real, name)
  local mode = files.lmode(real)
  if mode == nil then return nil end
  if mode ~= 'directory' then return ('%s exists and is not a directory'):format(name) end
  -- (a write probe left by a killed process of ours is no user file)
  local entries = {}
  for _, n in ipairs(files.list(real)) do
    if not files.is_write_probe(n) then entries[#entries + 1] = n end
  end
  if #entries == 0 then return nil end
  local ok, m = pcall(read_manifest, real)
  if not ok then return (tostring(m):gsub('^[^%s:]+:%d+: ', '')) end
  if not m then
    local shown = {}
    for i = 1, math.min(3, #entries) do shown[i] = entries[i] end
    return ('%s is not empty (it holds %s%s) and is not an export of fsdp-lua (no %s): an export replaces its '
      .. 'directory as a whole, so give a new or empty directory'):format(name, table.concat(shown, ', '),
      #entries > 3 and ', ...' or '', M.MANIFEST)
  end
  if m.state ~= 'complete' then
    return ('%s holds an unfinished export (%s says "%s")'):format(name, M.MANIFEST, m.state)
  end
  local extra = foreign_entries(real, m)
  if #extra > 0 then
    return ('%s is an export of fsdp-lua but also holds %s, which the export did not write: move %s out, or give '
      .. 'another directory'):format(name, extra[1], #extra == 1 and 'it' or 'them')
  end
  local parent_dev = lfs.attributes(files.dirname(real), 'dev')
  if parent_dev and lfs.attributes(real, 'dev') ~= parent_dev then
    return ('%s is a mount point: an export is built beside its directory and renamed into place, which cannot '
      .. 'cross file systems; give a directory inside it'):format(name)
  end
  return nil
end

-- Remove dir, one of ours: a complete manifest is marked "discarded"
-- first (a crash midway leaves a directory loaders refuse), files go
-- before the manifest, then the directory.
local function discard(dir)
  local m = read_manifest(dir)
  if m and m.state == 'complete' then
    m.state = 'discarded'
    write_manifest(dir, m)
    test_point('discarding')
  end
  for _, n in ipairs(files.list(dir)) do
    local p = files.join(dir, n)
    if n ~= M.MANIFEST then
      if files.lmode(p) == 'directory' then files.remove_tree(p) else os.remove(p) end
    end
  end
  files.remove_tree(dir)
  files.fsync(files.dirname(dir))
end

-- Whether dir holds only what a publication put there: a manifest of ours
-- (and for a complete one, only what it lists), or nothing but the
-- temporary file of a manifest being written.
local function ours(dir)
  local ok, m = pcall(read_manifest, dir)
  if not ok then return false end
  if m then return m.state ~= 'complete' or #foreign_entries(dir, m) == 0 end
  for _, n in ipairs(files.list(dir)) do
    if not n:find(MANIFEST_TMP) then return false end
  end
  return true
end

-- The leftovers of publications to parent/base whose process is gone
-- (this host), when they are ours: {path, kind = 'partial' | 'old' |
-- 'probe'} (a probe: the empty directory M.problem makes and removes).
local function stale(parent, base)
  local prefix, out = '.' .. base .. '.', {}
  for _, n in ipairs(files.list(parent)) do
    if n:sub(1, #prefix) == prefix then
      local kind, host, p, start = parse_tag(n:sub(#prefix + 1))
      local path = files.join(parent, n)
      local dead = host == HOST and p and (p == pid() or not alive(p, start)) and files.lmode(path) == 'directory'
      if dead and ((kind == 'partial' or kind == 'old') and ours(path)
                   or kind == 'probe' and #files.list(path) == 0) then
        out[#out + 1] = { path = path, kind = kind }
      end
    end
  end
  return out
end

-- Before a publication: a previous directory that an interrupted one moved
-- aside is put back when the target is missing (so a failure of this one
-- leaves the user where they were), then the other leftovers go.
local function recover(real, parent, base)
  local left = stale(parent, base)
  for _, s in ipairs(left) do
    if s.kind == 'old' and files.lmode(real) == nil then
      files.rename(s.path, real)
      s.restored = true
    end
  end
  for _, s in ipairs(left) do
    if s.kind == 'probe' then lfs.rmdir(s.path)
    elseif not s.restored then discard(s.path) end
  end
end

-- Where an interrupted publication left the previous directory of path
-- (`.NAME.old-HOST-PID-START` beside it), or nil: loaders add it to "does not
-- exist".
function M.moved_aside(path)
  local ok, real, parent, base = pcall(target, path)
  if not ok or files.lmode(real) ~= nil or files.mode(parent) ~= 'directory' then return nil end
  local prefix = '.' .. base .. '.old-'
  for _, n in ipairs(files.list(parent)) do
    if n:sub(1, #prefix) == prefix then return files.join(parent, n) end
  end
  return nil
end

-- The hint for a missing path ('' when none): appended to "does not exist".
function M.missing_hint(path)
  local aside = M.moved_aside(path)
  if not aside then return '' end
  return (' (an interrupted export moved the previous one to %s: `mv %s %s` restores it)'):format(aside, aside, path)
end

-- Why dir cannot receive a publication, or nil: checked with the options,
-- before any work, and again by begin() and before the swap.
function M.problem(dir)
  local ok, real, parent, base = pcall(target, dir)
  if not ok then return (tostring(real):gsub('^[^%s:]+:%d+: ', '')) end
  local why = replace_problem(real, dir)
  if why then return why end
  -- The new directory is made beside it: the parent must take entries.
  -- (Named as a sibling of the target, so one a killed process left is
  -- found and removed with the other leftovers.)
  local probe = sibling(parent, base, 'probe')
  local made, err = lfs.mkdir(probe)
  if not made then
    return ('cannot create entries in %s (an export is built beside %s and renamed into place): %s'):format(parent,
      dir, tostring(err))
  end
  lfs.rmdir(probe)
  return nil
end

local Stage = {}
Stage.__index = Stage

-- Start publishing dir: checks that it may be replaced, removes the
-- leftovers of dead publications to it, and creates the sibling to write
-- into (stage.dir) with its "writing" manifest. opts.what: the caller, for
-- messages.
function M.begin(dir, opts)
  opts = opts or {}
  if type(dir) == 'string' and dir ~= '' then
    local up = files.dirname((dir:gsub('/+$', '')))
    if files.mode(up) == nil then files.mkdir_p(up, opts.what) end
  end
  local real, parent, base = target(dir)
  local why = replace_problem(real, dir)
  if why then core.fail(why) end
  recover(real, parent, base)
  why = replace_problem(real, dir) -- a restored directory is checked as any other
  if why then core.fail(why) end
  local staging = sibling(parent, base, 'partial')
  local ok, err = lfs.mkdir(staging)
  if not ok then
    fail('cannot create %s (an export is built beside %s and renamed into place): %s', staging, dir, tostring(err))
  end
  local self = setmetatable({ dir = staging, target = real, name = dir, parent = parent, base = base, id = new_id(),
                              what = opts.what }, Stage)
  local wrote, werr = pcall(write_manifest, staging, { state = 'writing', id = self.id,
                                                       writer = { host = HOST, pid = pid(), start = own_start() } })
  if not wrote then
    lfs.rmdir(staging)
    error(werr, 0)
  end
  return self
end

-- The export id a weight file or index carries (nil when none).
local function id_of(path)
  if path:match('%.json$') then
    local doc = json.decode(files.read(path) or '')
    if type(doc) ~= 'table' then fail('%s is not a JSON object', path) end
    return type(doc.metadata) == 'table' and doc.metadata[M.ID_KEY] or nil
  end
  local f = st_file.open(path)
  local id = f:metadata()[M.ID_KEY]
  f:close()
  return id
end

local function is_tagged(name) return name:match('%.safetensors$') or name:match('%.safetensors%.index%.json$') end

-- Publish: the manifest completed, then the swap with the old directory
-- (removed after). Returns the target's path as given.
function Stage:commit()
  if self.done then fail('publish: %s was already committed or aborted', self.name) end
  local list, tagged = {}, {}
  for _, n in ipairs(files.list(self.dir)) do
    if n ~= M.MANIFEST then
      list[#list + 1] = n
      if is_tagged(n) then
        if id_of(files.join(self.dir, n)) ~= self.id then
          fail('publish: %s does not carry the export id in %s (its writer must be given stage.id)', n, M.ID_KEY)
        end
        tagged[#tagged + 1] = n
      end
    end
  end
  write_manifest(self.dir, { state = 'complete', id = self.id,
                             writer = { host = HOST, pid = pid(), start = own_start() },
                             files = json.array(list), tagged = json.array(tagged) })
  test_point('complete')
  local old
  if files.lmode(self.target) == nil then
    files.rename(self.dir, self.target)
  else
    local why = replace_problem(self.target, self.name)
    if why then core.fail(why) end
    local swapped = os.getenv('FSDP_TEST_NO_EXCHANGE') == nil and files.exchange(self.dir, self.target)
    if swapped then
      old = self.dir
    else
      -- Two renames (see the Note): between them the target is missing
      -- and the old directory whole under the .old name.
      old = sibling(self.parent, self.base, 'old')
      files.rename(self.target, old)
      test_point('aside')
      local ok, err = pcall(files.rename, self.dir, self.target)
      if not ok then
        pcall(files.rename, old, self.target) -- the old one back where it was
        error(err, 0)
      end
    end
  end
  self.done = true
  test_point('swapped')
  if old then
    local kept = not ours(old)
    local ok, err = true, nil
    if not kept then ok, err = pcall(discard, old) end
    if kept or not ok then
      io.stderr:write(('%s: %s is in place; the previous one is kept in %s (%s)\n'):format(self.what or 'publish',
        self.name, old, kept and 'it holds files the export did not write' or tostring(err)))
    end
  end
  return self.name
end

-- Give up: the sibling and what was written into it are removed; the
-- target is untouched.
function Stage:abort()
  if self.done then return end
  self.done = true
  pcall(discard, self.dir)
end

-- For loaders: raises, naming dir, when it is an export of ours that is
-- unfinished (or being removed), lacks a file its manifest lists, or
-- holds weight files of another export. A directory without a manifest
-- passes.
function M.check(dir)
  if files.mode(dir) ~= 'directory' then return end
  local m = read_manifest(dir)
  if not m then return end
  -- A sibling of ours is never taken for an export, even a whole one (the
  -- new one not yet swapped in, the old one not yet removed).
  local path = dir:gsub('/+$', '')
  local last = path:match('[^/]+$') or ''
  local base, kind = last:match('^%.(.+)%.(%a+)%-[%w%._]+%-%d+%-%d+$')
  if not base then base, kind = last:match('^%.(.+)%.(%a+)%-[%w%._]+%-%d+$') end
  local name = base and files.join(files.dirname(path), base)
  if kind == 'old' then
    fail('%s is the previous export of %s, moved aside by an interrupted export: `mv %s %s` restores it (the next '
      .. 'export to %s does)', dir, name, dir, name, name)
  elseif kind == 'partial' then
    fail('%s is the temporary directory of an interrupted export to %s, not an export: load %s (the next export '
      .. 'there removes it)', dir, name, name)
  end
  if m.state == 'writing' then
    fail('%s is an unfinished export (%s says "writing"): the export was interrupted, or is still running; '
      .. 'export again', dir, M.MANIFEST)
  elseif m.state ~= 'complete' then
    fail('%s is a replaced export being removed (%s says "%s"): load the directory it was replaced in', dir,
      M.MANIFEST, m.state)
  end
  for _, n in ipairs(m.files) do
    if files.lmode(files.join(dir, n)) == nil then
      fail('%s is not a complete export: %s is missing (its %s lists it)', dir, n, M.MANIFEST)
    end
  end
  for _, n in ipairs(m.tagged) do
    local ok, id = pcall(id_of, files.join(dir, n))
    if not ok then error(id, 0) end
    if id ~= m.id then
      fail('%s mixes files of two exports: %s is from export %s, its %s says %s', dir, n, tostring(id or 'none'),
        M.MANIFEST, m.id)
    end
  end
end

return M
