-- fsdp.checkpointing.lock: a checkpoint directory has one owner, the job
-- that locked it.
--
--   local lock = require 'fsdp.checkpointing.lock'
--   local info = lock.acquire('ckpt')   -- collective; raises when another job holds it
--   -- info.taken_over: the line of a job that died holding it, or nil
--   lock.release('ckpt')                -- (tests, long-lived processes) let go now
--
-- [Note: one job per checkpoint directory]
-- Two jobs saving into one directory destroy each other's checkpoints: a
-- save first clears a step directory of its own step (the other job's,
-- reported saved), pruning deletes the other's older checkpoints, and a
-- resume loads the other's state; the second job then died in a save whose
-- directory the first had just removed. So a directory has one owner:
-- rank 0 of a job takes an advisory lock (flock, core/io/lock_file.c) on
-- <dir>/LOCK and holds it until its process ends; the kernel releases it
-- then, however the process ends (kill -9, out of memory, a Slurm time
-- limit or requeue), so the next job, or the same job restarted, takes it
-- at once and says whose lock it took over. The file holds the holder's
-- line (host, pid, since when, ranks, Slurm job), which a refused job
-- names.
-- acquire is collective and cheap (an all-gather of a digest, then of rank
-- 0's verdict): every rank calls it, every rank learns the same outcome in
-- the same call, and a refused job stops on every rank before anything is
-- built, read or written (the recipes call it right after their options,
-- fsdp.checkpointing.options.lock; save and the recipes' resume call it
-- too, so a training script of its own is covered at its first save).
-- Ranks given different directories are refused by name (dist.agree)
-- rather than left waiting in a collective.
-- Readers (generation, export, --init_from) take no lock. A file system
-- that refuses locks (NFS without its lock service, Lustre without -o
-- flock) gets a warning, and the run goes on unprotected.
local core = require 'fsdp.core'
local dist = require 'fsdp.dist'
local files = require 'fsdp.io.files'
local json = require 'fsdp.io.json'
local ffi, C = core.ffi, core.C

local M = {}

M.FILE = 'LOCK'

local HOLDER_BYTES = 1024

-- What this process holds (rank 0) and which directories every rank has
-- settled, keyed by the directory as given (the same on every rank: the
-- call is collective).
local held, settled = {}, {}

-- The note in the holder's line: what a person reading a refusal needs to
-- find the job.
local function note()
  local parts = {}
  local w = dist.world_size()
  parts[#parts + 1] = ('%d rank%s'):format(w, w == 1 and '' or 's')
  local job = os.getenv('SLURM_JOB_ID')
  if job and job ~= '' then parts[#parts + 1] = 'Slurm job ' .. job end
  return table.concat(parts, ', ')
end

-- Rank 0's attempt: a verdict table, and the handle when it is held.
local function try(dir)
  local ok, err = pcall(files.mkdir_p, dir, 'checkpoint lock')
  if not ok then return { status = 'failed', why = (tostring(err):gsub('^[^%s:]+:%d+: ', '')) } end
  local path = files.join(dir, M.FILE)
  local buf = ffi.new('char[?]', HOLDER_BYTES)
  local h = C.fl_file_lock(path, note(), buf, HOLDER_BYTES)
  local text = ffi.string(buf)
  if h >= 0 then
    return { status = 'held', path = path, previous = text ~= '' and text or nil }, h
  end
  local why = core.last_error()
  C.fl_clear_error()
  if h == C.FL_LOCK_HELD then return { status = 'busy', path = path, holder = text } end
  if h == C.FL_LOCK_UNSUPPORTED then return { status = 'unsupported', path = path, why = why } end
  return { status = 'failed', path = path, why = why }
end

-- Take dir's lock for this job (collective). Returns {path =, taken_over
-- = the line a dead holder left, or nil; unlocked = why, when the file
-- system has no locks}. Raises on every rank, the same message, when
-- another job holds it or it cannot be taken.
-- dir '' (a run without checkpoints) only agrees, so a rank given a
-- directory that the others were not is refused rather than left waiting.
function M.acquire(dir)
  if type(dir) ~= 'string' then core.fail('checkpoint lock: expects a directory, got ' .. type(dir)) end
  if settled[dir] then return settled[dir] end
  dist.agree('the checkpoint directory', { checkpoint_dir = dir })
  if dir == '' then return nil end
  local verdict, handle
  if dist.rank() == 0 then verdict, handle = try(dir) end
  if dist.world_size() > 1 then
    local text = dist.all_gather_strings(verdict and json.encode(verdict) or '')[1]
    verdict = json.decode(text)
  end
  if verdict.status == 'busy' then
    core.fail(('checkpoint directory %s is in use by another job (%s)'):format(dir,
      verdict.holder ~= '' and verdict.holder or 'which did not say who it is'))
  elseif verdict.status == 'failed' then
    core.fail(('checkpoint directory %s cannot be locked: %s'):format(dir, verdict.why))
  end
  local info = { path = verdict.path, taken_over = verdict.previous }
  if verdict.status == 'unsupported' then info.unlocked = verdict.why end
  if handle then
    -- The handle goes with the process (or release): the kernel drops the
    -- lock at exit anyway; closing the state empties the file first.
    held[dir] = ffi.gc(ffi.new('int[1]', handle), function(p) C.fl_file_unlock(p[0]) end)
  end
  settled[dir] = info
  return info
end

-- Let dir's lock go now (rank 0 holds it; a no-op elsewhere and for a
-- directory not locked by this process).
function M.release(dir)
  settled[dir] = nil
  local h = held[dir]
  if not h then return end
  held[dir] = nil
  ffi.gc(h, nil)
  core.check(C.fl_file_unlock(h[0]))
end

-- Whether this process holds dir's lock (rank 0 of the owning job).
function M.holds(dir) return held[dir] ~= nil end

return M
