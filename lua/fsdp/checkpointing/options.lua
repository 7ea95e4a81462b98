-- fsdp.checkpointing.options: the checkpoint options every training recipe
-- shares, and the three points where a training loop meets them.
--
--   local ckpt_options = require 'fsdp.checkpointing.options'
--   local cfg = options.config(ckpt_options.options(shard_options.options({...})), arg, script)
--   local objs = {model = m, optimizer = opt, scheduler = sched, data = data}
--   objs.guard = nonfinite.guard(cfg, objs, script)      -- optional (fsdp.nonfinite)
--   ckpt_options.lock(cfg)                                -- before building: --checkpoint_dir is this job's
--   local start = ckpt_options.resume(cfg, objs)          -- 0, or the step resumed from
--   for step = start + 1, cfg.max_steps do
--     ... one step ...
--     ckpt_options.after_step(cfg, objs, step)            -- saves every --checkpoint_freq steps
--   end
--   ckpt_options.finish(cfg, m)                           -- --save_full_state_dict
--
-- The same command serves a fresh start and every restart after a crash or
-- a requeue (the seed's Slurm recipe): with --resume_from_checkpoint the run
-- continues from the newest complete checkpoint in --checkpoint_dir when
-- there is one (falling back past damaged ones, saying why), and starts
-- fresh otherwise.
--
-- A checkpoint directory belongs to one job ([Note: one job per
-- checkpoint directory] in fsdp.checkpointing.lock): lock() takes it right
-- after the options, so a second job on the same directory stops in a
-- second, one line naming the first, with exit status EXIT_LOCKED and
-- nothing of the first's touched. resume() and after_step() take it too
-- (once), for a script that does not call lock() itself.
--
-- Test hook: FSDP_TEST_KILL_AT_STEP=N kills rank 0 with SIGKILL right after
-- step N (and after the checkpoint of step N, if one is due), as a crash
-- would; mpirun then ends the job (tests/mpi/ckpt_recipe.sh).
local dist = require 'fsdp.dist'
local clock = require 'fsdp.clock'
local files = require 'fsdp.io.files'
local ckpt = require 'fsdp.checkpointing'
local json = require 'fsdp.io.json'
local dir_lock = require 'fsdp.checkpointing.lock'
local console = require 'fsdp.observe.console'
local options = require 'fsdp.options'
local ckpt_load = require 'fsdp.checkpointing.load'
local profiler = require 'fsdp.observe.profiler'

local M = {}

-- The exit status of a job refused a checkpoint directory (another job
-- holds it, or it cannot be locked): distinct from an error's 1, a usage
-- mistake's 2 and a non-finite stop's 3, so a requeue script can tell that
-- running again would be refused again.
M.EXIT_LOCKED = 4

-- Each entry carries its constraints (fsdp.options checks them before a
-- recipe builds anything): the output paths are created and probed for
-- writing at start, not found unwritable at the first save or after the
-- whole run.
M.OPTIONS = {
  checkpoint_dir = { '', 'directory of sharded checkpoints (one step-NNNNNN/ per save); empty: no checkpoints',
                     output = 'dir' },
  checkpoint_freq = { 0, 'save a sharded checkpoint every N steps, and after the last (0: never)',
                      int = true, min = 0, needs = 'checkpoint_dir' },
  keep_checkpoints = { 2, 'complete checkpoints to keep; older ones are deleted (their own files only) after a save (0: keep all)',
                       int = true, min = 0 },
  resume_from_checkpoint = { false, 'continue from the newest intact checkpoint in --checkpoint_dir, if any (damaged ones are named and skipped); '
                             .. '=DIR (the seed\'s form): the same with --checkpoint_dir=DIR',
                             needs = 'checkpoint_dir', values = function(text)
                               local word = text:lower()
                               if word == 'true' or word == 'false' or word == '1' or word == '0' or word == 'yes'
                                  or word == 'no' or text == '' then return nil end
                               return true, { checkpoint_dir = text }
                             end },
  save_full_state_dict = { '', 'at the end, write the whole model to this safetensors file (HF names, one unit at a time)',
                           output = 'file' },
}

-- A recipe's own options plus these (its own win on a clash).
function M.options(own) return options.merge(M.OPTIONS, own) end

-- rank 0's line ("[rank 0] " first with several ranks; fsdp.console)
local function say(fmt, ...) console.print(fmt:format(...)) end

local function check(cfg)
  if (cfg.checkpoint_freq > 0 or cfg.resume_from_checkpoint) and cfg.checkpoint_dir == '' then
    error('--checkpoint_freq and --resume_from_checkpoint need --checkpoint_dir', 0)
  end
end

-- Stop every rank with `status` after rank 0 wrote msg as the one line
-- (a collective: the launcher ends the job at the first rank that exits
-- non-zero, so no rank exits before rank 0 has written).
local function stop_all(msg, status)
  if dist.rank() == 0 then
    io.stdout:flush()
    io.stderr:write('fsdp-lua: ', msg, '\n')
    io.stderr:flush()
  end
  io.stdout:flush()
  if dist.world_size() > 1 then dist.barrier() end
  os.exit(status, true)
end

local locked = setmetatable({}, { __mode = 'k' }) -- the configs lock() has settled

-- Take --checkpoint_dir for this job (collective: every rank calls it,
-- with or without --checkpoint_dir, before anything is built). Refused:
-- one line on rank 0 naming the holder (or why it cannot be locked), and
-- every rank exits with EXIT_LOCKED after it was written. Taking over the
-- lock of a job that died, or running unprotected on a file system without
-- locks, is said on rank 0. Once per config; later calls do nothing.
function M.lock(cfg)
  if locked[cfg] then return end
  locked[cfg] = true
  local ok, info = pcall(dir_lock.acquire, cfg.checkpoint_dir)
  if not ok then
    local msg = tostring(info):gsub('^[^%s:]+:%d+: ', '')
    local plain = cfg.checkpoint_dir:gsub('%p', '%%%0')
    msg = msg:gsub('^checkpoint directory ' .. plain .. ' ', '--checkpoint_dir ' .. cfg.checkpoint_dir .. ' ')
    if msg:sub(1, 2) ~= '--' then msg = '--checkpoint_dir: ' .. msg end
    if msg:find('is in use by another job', 1, true) then
      msg = msg .. '; this job stops without touching it: wait for that job to end, or give this one another '
        .. '--checkpoint_dir'
    end
    stop_all(msg, M.EXIT_LOCKED)
  end
  -- The run's options that differ from the defaults, beside its
  -- checkpoints: `--config DIR/config.yaml` repeats it (fsdp.options.save_config).
  if cfg.checkpoint_dir ~= '' and dist.rank() == 0 then
    local ok, path, script = pcall(options.save_config, cfg, cfg.checkpoint_dir)
    if ok then
      say('config: saved %s (fsdp-lua %s --config %s repeats this run)', path, script or 'RECIPE', path)
    else
      say('config: warning: cannot save the options in %s: %s', cfg.checkpoint_dir, tostring(path))
    end
  end
  if info and info.taken_over then
    say('checkpoint: took over %s from a job that ended without releasing it (%s)', info.path, info.taken_over)
  elseif info and info.unlocked then
    say('checkpoint: warning: %s cannot be locked (%s): the file system has no locks, so another job using %s '
      .. 'would not be stopped', info.path, info.unlocked, cfg.checkpoint_dir)
  end
end

-- The step to continue after: the resumed checkpoint's, or 0, and what its
-- load said (ckpt.load's info: step, extra, ...) when one was. The newest
-- complete checkpoint that passes ckpt.check is loaded; a refused one
-- (damaged, swapped or stale file) is named with the reason and the next
-- older one tried, every rank taking the same branch. When checkpoints
-- exist but none is intact the run stops rather than start over.
function M.resume(cfg, objs)
  check(cfg)
  M.lock(cfg)
  if not cfg.resume_from_checkpoint then return 0 end
  -- Rank 0's view of the directory, so every rank walks the same list.
  local s = ckpt.directory.scan(cfg.checkpoint_dir)
  if dist.world_size() > 1 then s = json.decode(dist.all_gather_strings(json.encode(s))[1]) end
  local newest = s.complete[#s.complete]
  for _, e in ipairs(s.incomplete) do
    if not newest or e.step >= newest.step then
      say('checkpoint: skipping %s: no %s (its save was interrupted)', e.path, ckpt.directory.COMPLETE)
    end
  end
  local refused = {}
  for i = #s.complete, 1, -1 do
    local dir = s.complete[i].path
    local t0 = clock.now()
    local index, why = ckpt.check(dir)
    if index then
      if #refused > 0 then say('checkpoint: falling back to %s, the newest intact checkpoint', dir) end
      local ok, info = pcall(ckpt.load, dir, objs, index)
      -- A refusal all ranks share (the data changed since the save: fsdp.data.changes)
      -- ends the job with one line from rank 0, before any tensor is read.
      if not ok and ckpt_load.is_refusal(info) then
        if dist.rank() == 0 then
          io.stdout:flush()
          io.stderr:write(('fsdp-lua: %s\n'):format(tostring(info)))
          io.stderr:flush()
        end
        if dist.world_size() > 1 then dist.barrier() end
        os.exit(1, true)
      end
      if not ok then error(info, 0) end
      -- The non-finite guard's count of skipped steps goes on from where the
      -- checkpoint's run left it (fsdp.nonfinite).
      if objs.guard and type(info.extra) == 'table' and type(info.extra.nonfinite_skips) == 'number' then
        objs.guard.skips = info.extra.nonfinite_skips
      end
      say('checkpoint: resumed from %s (step %d, saved on %d rank%s, %s) in %.2f s', dir, info.step,
        info.world_size, info.world_size == 1 and '' or 's', info.strategy, clock.now() - t0)
      return info.step, info
    end
    -- why names the file; the directory is said once
    local plain = dir:gsub('%p', '%%%0')
    say('checkpoint: refusing %s: %s', dir, (why:gsub('^checkpoint ' .. plain .. ': ', '')))
    refused[#refused + 1] = dir
  end
  if #refused > 0 then
    error(('checkpoint: no intact checkpoint in %s (refused: %s); move them aside to start fresh')
      :format(cfg.checkpoint_dir, table.concat(refused, ', ')), 0)
  end
  say('checkpoint: no complete checkpoint in %s: starting fresh', cfg.checkpoint_dir)
  return 0
end

local function dir_bytes(dir)
  local n = 0
  for _, name in ipairs(files.list(dir)) do n = n + files.size(files.join(dir, name)) end
  return n
end

-- A save that failed (every rank alike: checkpointing.save agrees on it),
-- a full disk say: one line on rank 0 naming the step, why and the newest
-- checkpoint, which the failure left as it was (a failed save writes no
-- COMPLETE and prunes nothing); every rank exits 1, as on an error, after
-- rank 0 has written.
local function save_failed(cfg, err)
  local msg = tostring(err):gsub('^[^%s:]+:%d+: ', ''):gsub('^checkpointing%.save: ', 'checkpoint: ')
  local latest = ckpt.latest(cfg.checkpoint_dir)
  msg = msg .. (latest and ('; the newest checkpoint is %s'):format(latest)
    or ('; %s holds no complete checkpoint'):format(cfg.checkpoint_dir))
  stop_all(msg, 1)
end

-- Save when step is a multiple of --checkpoint_freq or the last step; then
-- the kill hook. objs: as resume's (objs.guard, a fsdp.nonfinite guard:
-- the parameters are checked finite first and its skip count is saved
-- too); extra: stored in the index. A step the
-- guard stopped at never gets here (the run ends inside guard:step), so
-- no checkpoint holds non-finite gradients' updates and none is pruned
-- because of them.
function M.after_step(cfg, objs, step, extra)
  if cfg.checkpoint_freq > 0 and (step % cfg.checkpoint_freq == 0 or step == cfg.max_steps) then
    M.lock(cfg)
    if objs.guard then
      objs.guard:check_parameters(step) -- ends the run rather than save non-finite parameters
      local e = {}
      for k, v in pairs(extra or {}) do e[k] = v end
      e.nonfinite_skips = objs.guard.skips
      extra = e
    end
    local t0 = clock.now()
    local ok, dir = pcall(profiler.call, 'checkpoint save', 'ckpt', ckpt.save,
      cfg.checkpoint_dir, {
        model = objs.model, optimizer = objs.optimizer, scheduler = objs.scheduler, data = objs.data,
        step = step, keep = cfg.keep_checkpoints, extra = extra,
      })
    if not ok then save_failed(cfg, dir) end
    local dt = clock.now() - t0
    if dist.rank() == 0 then
      local mb = dir_bytes(dir) / 2^20
      say('checkpoint: saved %s (%.1f MiB) in %.2f s', dir, mb, dt)
    end
  end
  if os.getenv('FSDP_TEST_KILL_AT_STEP') == tostring(step) and dist.rank() == 0 then
    ckpt.kill_self('FSDP_TEST_KILL_AT_STEP=' .. step)
  end
end

-- --save_full_state_dict: the whole model, streamed unit by unit.
function M.finish(cfg, model)
  if cfg.save_full_state_dict == '' then return end
  local t0 = clock.now()
  ckpt.save_full_state_dict(cfg.save_full_state_dict, model)
  say('full state dict: wrote %s in %.2f s', cfg.save_full_state_dict, clock.now() - t0)
end

return M
