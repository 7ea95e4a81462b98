-- fsdp.checkpointing.layout: the on-disk layout of sharded checkpoints and
-- the questions asked of a checkpoint directory (which steps are complete,
-- which is newest, which to delete), apart from what the files hold.
--
--   <dir>/step-000120/rank-00000-of-00004.safetensors   one per rank
--                     ...
--                     index.json                         written by rank 0
--                     COMPLETE                           written last
--
-- A step directory counts only once COMPLETE exists: every file is
-- published atomically (fsdp.files), and COMPLETE is written by rank 0
-- after every rank's file and the index are in place, so a crash at any
-- point of a save leaves either a complete checkpoint or a directory
-- without COMPLETE, which latest() skips and reports.
local core = require 'fsdp.core'
local files = require 'fsdp.files'
local json = require 'fsdp.json'

local M = {}

M.INDEX = 'index.json'
M.COMPLETE = 'COMPLETE'
M.FORMAT = 'fsdp-lua sharded checkpoint'
M.VERSION = 1

function M.step_name(step) return ('step-%06d'):format(step) end
function M.step_dir(dir, step) return files.join(dir, M.step_name(step)) end
function M.rank_file(rank, world) return ('rank-%05d-of-%05d.safetensors'):format(rank, world) end

function M.is_complete(step_dir) return files.mode(files.join(step_dir, M.COMPLETE)) == 'file' end

-- The step directories of dir, oldest first: {complete = {{step=, path=}...},
-- incomplete = {...}}. A missing dir has none.
function M.scan(dir)
  local out = { complete = {}, incomplete = {} }
  if files.mode(dir) ~= 'directory' then return out end
  for _, name in ipairs(files.list(dir)) do
    local digits = name:match('^step%-(%d+)$')
    local path = files.join(dir, name)
    if digits and files.mode(path) == 'directory' then
      local e = { step = tonumber(digits), path = path }
      table.insert(M.is_complete(path) and out.complete or out.incomplete, e)
    end
  end
  local by_step = function(a, b) return a.step < b.step end
  table.sort(out.complete, by_step)
  table.sort(out.incomplete, by_step)
  return out
end

-- The newest complete step directory of dir and its step, or nil; third:
-- the incomplete directories newer than it (a save that crashed), which
-- were skipped.
function M.latest(dir)
  local s = M.scan(dir)
  local last = s.complete[#s.complete]
  local skipped = {}
  for _, e in ipairs(s.incomplete) do
    if not last or e.step >= last.step then skipped[#skipped + 1] = e.path end
  end
  if not last then return nil, nil, skipped end
  return last.path, last.step, skipped
end

-- After the save of `step` completed: delete complete checkpoints beyond
-- the newest `keep` (never `step` itself) and incomplete directories older
-- than `step` (crashed saves). COMPLETE goes first, so an interrupted
-- deletion leaves an incomplete directory, never a broken complete one.
-- Returns the paths removed.
function M.prune(dir, keep, step)
  local s = M.scan(dir)
  local removed = {}
  if keep and keep > 0 then
    local n = #s.complete
    for i, e in ipairs(s.complete) do
      if i <= n - keep and e.step ~= step then
        files.remove_tree(e.path, M.COMPLETE)
        removed[#removed + 1] = e.path
      end
    end
  end
  for _, e in ipairs(s.incomplete) do
    if e.step < step then
      files.remove_tree(e.path)
      removed[#removed + 1] = e.path
    end
  end
  if #removed > 0 then files.fsync(dir) end
  return removed
end

-- index.json --------------------------------------------------------------------------

local function bad(path, fmt, ...)
  core.fail(('checkpoint index %s: ' .. fmt):format(path, ...))
end

local function check_int(path, v, what, min)
  if type(v) ~= 'number' or v ~= math.floor(v) or v < (min or 0) then
    bad(path, '%s must be an integer >= %d, got %s', what, min or 0, tostring(v))
  end
end

-- The index of step_dir, read and checked: every field load() relies on
-- is present and well formed, so a damaged index fails here, naming the
-- file and the field, before any tensor is touched.
function M.read_index(step_dir)
  local path = files.join(step_dir, M.INDEX)
  local text, err = files.read(path)
  if not text then core.fail(('checkpoint index %s cannot be read: %s'):format(path, tostring(err))) end
  local doc, jerr = json.decode(text)
  if doc == nil then bad(path, 'not valid JSON (%s)', jerr) end
  if type(doc) ~= 'table' or doc.format ~= M.FORMAT then
    bad(path, 'not a sharded checkpoint index (format is %s, expected "%s")',
      type(doc) == 'table' and tostring(doc.format) or type(doc), M.FORMAT)
  end
  if doc.version ~= M.VERSION then
    bad(path, 'version %s, this build reads version %d', tostring(doc.version), M.VERSION)
  end
  check_int(path, doc.step, 'step')
  check_int(path, doc.world_size, 'world_size', 1)
  if type(doc.ranks) ~= 'table' or #doc.ranks ~= doc.world_size then
    bad(path, 'ranks must list the %d ranks that saved it', doc.world_size)
  end
  for r, info in ipairs(doc.ranks) do
    if type(info) ~= 'table' or type(info.file) ~= 'string' or info.file:find('/', 1, true) then
      bad(path, 'ranks[%d] needs a file name inside the checkpoint', r)
    end
  end
  if type(doc.parts) ~= 'table' then bad(path, 'parts is missing') end
  for i, part in ipairs(doc.parts) do
    local where = ('parts[%d]'):format(i)
    if type(part) ~= 'table' or type(part.key) ~= 'string' then bad(path, '%s needs a key', where) end
    where = where .. ' (' .. part.key .. ')'
    check_int(path, part.padded_numel, where .. '.padded_numel')
    if type(part.params) ~= 'table' or type(part.shards) ~= 'table' then
      bad(path, '%s needs params and shards', where)
    end
    for j, p in ipairs(part.params) do
      if type(p) ~= 'table' or type(p.name) ~= 'string' or type(p.shape) ~= 'table' then
        bad(path, '%s.params[%d] needs a name and a shape', where, j)
      end
      check_int(path, p.offset, ('%s.params[%d].offset'):format(where, j))
    end
    for j, sh in ipairs(part.shards) do
      local w = ('%s.shards[%d]'):format(where, j)
      if type(sh) ~= 'table' then bad(path, '%s must be an object', w) end
      check_int(path, sh.rank, w .. '.rank')
      if sh.rank >= doc.world_size then bad(path, '%s.rank %d is not below world_size %d', w, sh.rank, doc.world_size) end
      check_int(path, sh.start, w .. '.start')
      check_int(path, sh.len, w .. '.len')
    end
    if part.optim ~= nil and type(part.optim) ~= 'table' then bad(path, '%s.optim must be an object', where) end
  end
  doc.path = path
  return doc
end

return M
