-- fsdp.data.changes: what a data source's saved position says about its
-- files, against the files as they are now, and what a resume does about a
-- difference (--data_changed). The sources (fsdp.data.corpus, tokens,
-- pairs) record the fingerprints; this module compares listings and
-- applies the policy ([Note: the fingerprint of a data position] in
-- lua/fsdp/data/corpus.lua).
--
--   local changes = require 'fsdp.data.changes'
--   local found = changes.listing(saved.files, names, sizes)   -- {{file =, what =, refuse =}, ...}
--   changes.apply(self.data_changed, found)   -- raises on a refusing change under 'stop'; says the rest
local ffi = require 'ffi'
local core = require 'fsdp.core'
local console = require 'fsdp.observe.console'
local C = core.C

local M = {}

M.POLICIES = { 'stop', 'continue' }

-- The recipes' option (fsdp.options spec entry).
M.OPTION = { 'stop', 'on resume, when the data files changed since the checkpoint (a file truncated, edited where '
                     .. 'it was read, added or removed): stop refuses in one line naming the file; continue says '
                     .. 'what changed and goes on with the data as it is (appending to a file is allowed either way)',
             one_of = M.POLICIES }

-- A policy given to a source's open: 'stop' (the default) or 'continue'.
function M.policy(value, who)
  if value == nil then return 'stop' end
  if value ~= 'stop' and value ~= 'continue' then
    core.fail(('%s: data_changed must be stop or continue, got %s'):format(who, tostring(value)))
  end
  return value
end

-- XXH3-64 as the checkpoints write it ("xxh3-64:<16 hex>"), and back.
function M.hex(v)
  local out = ffi.new('char[?]', C.FL_CHECKSUM_TEXT)
  C.fl_checksum_text(v, out)
  return ffi.string(out)
end

function M.hash(bytes) return M.hex(C.fl_checksum(bytes, #bytes)) end

-- The uint64 of a text form, or nil for anything else.
function M.u64(text)
  if type(text) ~= 'string' then return nil end
  local hi, lo = text:match('^xxh3%-64:(%x%x%x%x%x%x%x%x)(%x%x%x%x%x%x%x%x)$')
  if not hi then return nil end
  return ffi.cast('uint64_t', tonumber(hi, 16)) * 4294967296ULL + ffi.cast('uint64_t', tonumber(lo, 16))
end

-- A listing as saved: an array of {name, size[, fingerprint]}; nil when
-- it is not one.
local function valid_listing(files)
  if type(files) ~= 'table' then return nil end
  for i = 1, #files do
    local e = files[i]
    if type(e) ~= 'table' or type(e[1]) ~= 'string' or type(e[2]) ~= 'number'
       or (e[3] ~= nil and type(e[3]) ~= 'string') then
      return nil
    end
  end
  return files
end
M.valid_listing = valid_listing

-- The changes between a saved listing ({{name, size[, fingerprint]}, ...})
-- and the files now (names, sizes and optionally fingerprints: arrays in
-- one order), each {file =, what =, refuse =}: removed and added files,
-- smaller ones and another fingerprint refuse; a larger file is taken as
-- appended to (a log that grows) and only said when `appendable`, else
-- refused too (a token shard cannot grow: it was replaced).
function M.listing(saved, names, sizes, prints, appendable)
  local out = {}
  local now, print_now = {}, {}
  for i, name in ipairs(names) do now[name], print_now[name] = sizes[i], prints and prints[i] end
  local was = {}
  for _, e in ipairs(saved) do
    local name, size = e[1], e[2]
    was[name] = true
    local cur = now[name]
    if cur ~= nil and cur > size and not appendable then
      out[#out + 1] = { file = name, refuse = true,
        what = ('now %d bytes, %d when the data position was saved (replaced)'):format(cur, size) }
    elseif cur ~= nil and cur == size and e[3] and print_now[name] and e[3] ~= print_now[name] then
      out[#out + 1] = { file = name, refuse = true,
        what = ('its content changed since the data position was saved (fingerprint %s then, %s now; same size)')
          :format(M.describe(e[3]), print_now[name]) }
    elseif cur == nil then
      out[#out + 1] = { file = name, refuse = true,
        what = ('removed since the data position was saved (%d files then, %d now)'):format(#saved, #names) }
    elseif cur < size then
      out[#out + 1] = { file = name, refuse = true,
        what = ('now %d bytes, %d when the data position was saved (truncated or rewritten)'):format(cur, size) }
    elseif cur > size then
      out[#out + 1] = { file = name, refuse = false,
        what = ('grew from %d to %d bytes since the data position was saved (taken as appended: what was read '
          .. 'before is checked where the position is, the rest is read as it comes)'):format(size, cur) }
    end
  end
  for _, name in ipairs(names) do
    if not was[name] then
      out[#out + 1] = { file = name, refuse = true,
        what = ('added since the data position was saved (%d files then, %d now)'):format(#saved, #names) }
    end
  end
  return out
end

-- A file name for a message: as it is, or quoted when it holds a control
-- character (a name from a damaged position must not break the line).
function M.name(file)
  file = tostring(file)
  if file:find('%c') then return ('%q'):format(file):gsub('\\\n', '\\n') end
  return file
end

-- A saved value for a message, on one line: a string as M.name gives it
-- (at most 60 bytes of it), a table by its kind.
function M.describe(v)
  if type(v) == 'string' then return M.name(#v > 60 and v:sub(1, 60) .. '...' or v) end
  if type(v) == 'table' then return 'a table of kind ' .. M.name(v.kind) end
  return tostring(v)
end

-- Under 'stop', raise the first refusing change found (one line naming
-- its file, and how many more there are); nothing else.
function M.refuse(policy, found)
  local refusing = {}
  for _, c in ipairs(found) do
    if c.refuse then refusing[#refusing + 1] = c end
  end
  if #refusing > 0 and policy ~= 'continue' then
    local c = refusing[1]
    local more = #refusing > 1 and (' (and %d more changed file%s)'):format(#refusing - 1, #refusing > 2 and 's' or '')
      or ''
    error(('%s: %s%s; resume refused (--data_changed=continue goes on with the data as it is)'):format(
      M.name(c.file), c.what, more), 0)
  end
end

-- Apply `policy` to the changes found: M.refuse, then every change is said
-- on this rank (one that stop refuses, with that the run goes on) and the
-- caller continues.
function M.apply(policy, found)
  M.refuse(policy, found)
  for _, c in ipairs(found) do
    console.print_all(('data: %s: %s%s'):format(M.name(c.file), c.what,
      c.refuse and '; going on with it as it is (--data_changed=continue)' or ''))
  end
end

return M
