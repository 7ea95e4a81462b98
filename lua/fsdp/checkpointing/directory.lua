-- fsdp.checkpointing.directory: the files a sharded checkpoint writes on disk and
-- the questions asked of a checkpoint directory (which steps are complete,
-- which is newest, which to delete), apart from what the files hold.
--
--   <dir>/LOCK                                         the owning job's line
--                                                      (fsdp.checkpointing.lock)
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
--
-- Every rank file records in its safetensors metadata the checksum of its
-- tensor data, the step, the run and the rank/world that wrote it (META),
-- and index.json records each file's checksum and the run: a file damaged,
-- swapped with another rank's, left from another step or copied from
-- another run is refused by fsdp.checkpointing.check.
--
-- Pruning and the replacement of a step directory delete only what a
-- checkpoint wrote (remove_checkpoint): the files its index names, the
-- index, COMPLETE and their temporaries, as regular files (lstat). A
-- symbolic link is never followed, recursed into or counted as a step
-- directory, and a stray entry is left where it is.
local core = require 'fsdp.core'
local files = require 'fsdp.io.files'
local json = require 'fsdp.io.json'

local M = {}

M.INDEX = 'index.json'
M.COMPLETE = 'COMPLETE'
M.FORMAT = 'fsdp-lua sharded checkpoint'
M.VERSION = 2 -- 2: rank files carry checksum, step, run and rank; 1 (no checks) still loads
M.META = { checksum = 'fsdp_checksum', step = 'fsdp_step', run = 'fsdp_run', rank = 'fsdp_rank',
           world = 'fsdp_world' }

function M.step_name(step) return ('step-%06d'):format(step) end
function M.step_dir(dir, step) return files.join(dir, M.step_name(step)) end
function M.rank_file(rank, world) return ('rank-%05d-of-%05d.safetensors'):format(rank, world) end

function M.is_complete(step_dir) return files.lmode(files.join(step_dir, M.COMPLETE)) == 'file' end

-- The step directories of dir, oldest first: {complete = {{step=, path=}...},
-- incomplete = {...}}. A missing dir has none; a symbolic link named like
-- a step directory is not one.
function M.scan(dir)
  local out = { complete = {}, incomplete = {} }
  if files.mode(dir) ~= 'directory' then return out end
  for _, name in ipairs(files.list(dir)) do
    local digits = name:match('^step%-(%d+)$')
    local path = files.join(dir, name)
    if digits and files.lmode(path) == 'directory' then
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

-- Whether `name` in a step directory is a file a checkpoint writes: the
-- index, COMPLETE, the rank files `listed` by its index (without a
-- readable index: names of the rank-file pattern), or a temporary of one
-- of them (a killed writer's "<name>.tmp.<pid>").
function M.is_ours(name, listed)
  local base = name:match('^(.-)%.tmp%.%d+$') or name
  if base == M.INDEX or base == M.COMPLETE then return true end
  if listed then return listed[base] == true end
  return base:match('^rank%-%d+%-of%-%d+%.safetensors$') ~= nil
end

-- Delete the checkpoint in step_dir: COMPLETE first (an interrupted
-- deletion leaves an incomplete directory, never a broken complete one),
-- then its own regular files, then the directory if nothing else is in
-- it. Never follows a link. Returns the number of files removed and the
-- names left (stray entries, or files that could not be removed).
function M.remove_checkpoint(step_dir)
  if files.lmode(step_dir) ~= 'directory' then return 0, {} end
  local listed
  local ok, index = pcall(M.read_index, step_dir)
  if ok then
    listed = {}
    for _, r in ipairs(index.ranks) do listed[r.file] = true end
  end
  local n, left = 0, {}
  local complete = files.join(step_dir, M.COMPLETE)
  if files.lmode(complete) == 'file' and os.remove(complete) then
    n = n + 1
    files.fsync(step_dir)
  end
  for _, name in ipairs(files.list(step_dir)) do
    local path = files.join(step_dir, name)
    local removed, err = nil, 'not written by this checkpoint'
    if files.lmode(path) == 'file' and M.is_ours(name, listed) then removed, err = os.remove(path) end
    if removed then n = n + 1 else left[#left + 1] = ('%s (%s)'):format(name, err) end
  end
  if #left == 0 then require('lfs').rmdir(step_dir) end
  return n, left
end

-- After the save of `step` completed: delete complete checkpoints of steps
-- up to `step` beyond the newest `keep` of them (never `step` itself, the
-- newest intact one; a newer directory is from an earlier life of the run,
-- e.g. one a resume refused, and is left alone) and incomplete directories
-- older than `step` (crashed saves). Never raises: a stray file must not
-- fail a save. Returns the paths removed and notes on what was left.
function M.prune(dir, keep, step)
  local s = M.scan(dir)
  local removed, notes = {}, {}
  local function drop(e)
    local ok, n, left = pcall(M.remove_checkpoint, e.path)
    if not ok then
      notes[#notes + 1] = ('%s: %s'):format(e.path, tostring(n))
    elseif #left == 0 then
      removed[#removed + 1] = e.path
    elseif n > 0 then -- said once: a later prune finds nothing of ours there
      notes[#notes + 1] = ('%s: left %s'):format(e.path, table.concat(left, ', '))
    end
  end
  local older = {}
  for _, e in ipairs(s.complete) do
    if e.step <= step then older[#older + 1] = e end
  end
  if keep and keep > 0 then
    for i, e in ipairs(older) do
      if i <= #older - keep and e.step ~= step then drop(e) end
    end
  end
  for _, e in ipairs(s.incomplete) do
    if e.step < step then drop(e) end
  end
  if #removed > 0 then pcall(files.fsync, dir) end
  return removed, notes
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
  if files.lmode(path) == 'link' then bad(path, 'is a symbolic link, not the index a save wrote') end
  local text, err = files.read(path, files.LIMITS.log[1], 'a checkpoint index')
  if not text then core.fail(('checkpoint index %s cannot be read: %s'):format(path, tostring(err))) end
  local doc, jerr = json.decode(text)
  if doc == nil then bad(path, 'not valid JSON (%s)', jerr) end
  if type(doc) ~= 'table' or doc.format ~= M.FORMAT then
    bad(path, 'not a sharded checkpoint index (format is %s, expected "%s")',
      type(doc) == 'table' and tostring(doc.format) or type(doc), M.FORMAT)
  end
  if doc.version ~= M.VERSION and doc.version ~= 1 then
    bad(path, 'version %s, this build reads versions 1 and %d', tostring(doc.version), M.VERSION)
  end
  if doc.version >= 2 and (type(doc.run) ~= 'string' or doc.run == '') then
    bad(path, 'run must name the run that saved it')
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
    if doc.version >= 2 and type(info.checksum) ~= 'string' then
      bad(path, 'ranks[%d] needs the checksum of its file', r)
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

-- What a checkpoint records of a model's LoRA adapters (fsdp.lora): the
-- settings that change what the saved adapters compute, not dropout.
function M.lora_settings(cfg)
  local targets = json.array({})
  for i, t in ipairs(cfg.targets) do targets[i] = t end
  return { rank = cfg.rank, alpha = cfg.alpha, rslora = cfg.rslora and true or false, targets = targets }
end

return M
