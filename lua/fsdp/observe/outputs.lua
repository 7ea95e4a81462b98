-- fsdp.observe.outputs: what a run does when a write to one of its outputs
-- (--metrics_file, --tensorboard_dir, --profile_dir's traces, --plot)
-- fails. The Logger (fsdp.observe.metrics) owns one and routes every write
-- through it.
--
--   local outputs = require 'fsdp.observe.outputs'
--   local o = outputs.Outputs({ policy = 'continue', checkpoint_dir = cfg.checkpoint_dir })
--   o:write('metrics_file', path, step, function() appender:write(line) end)  -- false once it failed
--   o:check_stop(step)   -- every rank, after each step: --on_output_error=stop ends the run here
--   o:close()            -- every rank, at the end: the ranks agree, exit status 5 if anything was lost
--
-- [Note: failed output writes]
-- A full disk cut the metrics JSONL in the middle of a record, stopped the
-- TensorBoard file, and the run ended with status 0 and no word. Now every
-- write is checked: the record files append through core/io/append_file.c
-- (a failed or short write raises, and the part that reached the file is
-- cut off, so it ends with a whole record), traces and plot data are
-- published whole or not at all (fl_file_write_atomic), gnuplot's status
-- and images are checked. A failure:
--   - is said at once, one line on the rank it happened on:
--     "fsdp-lua: warning: --metrics_file: m.jsonl: write failed after 0 of
--     398 bytes: No space left on device (step 12); nothing more is
--     written there; the run goes on and will exit with status 5";
--   - ends that output for the run (a file with a gap would pass for a
--     whole one; what it holds is whole records up to the failure);
--   - by default (--on_output_error=continue) leaves the training and its
--     checkpoints alone: they are what the run is for, and a checkpoint's
--     files are written and checked apart from these (a failed save fails
--     the save, never a checkpoint already complete). At the end
--     (Logger:close, collective) rank 0 prints one line naming every output
--     lost on any rank, and every rank exits with EXIT_STATUS once the rest
--     of the script (final checkpoint, full state dict, export) is done
--     (fsdp.host.set_exit_status);
--   - with --on_output_error=stop ends the run at the end of the step whose
--     write failed, on every rank alike (one all-reduce per step, only in
--     that mode), before that step's checkpoint: one line naming the output
--     and the newest checkpoint, exit status EXIT_STATUS. The steps since
--     that checkpoint are lost, as at any stop; resume from it.
local dist = require 'fsdp.dist'
local factories = require 'fsdp.factories'
local console = require 'fsdp.observe.console'
local checkpointing = require 'fsdp.checkpointing'
local json = require 'fsdp.io.json'

local M = {}

-- The exit status of a run that lost output (distinct from an error's 1,
-- a usage mistake's 2, a non-finite stop's 3 and a refused checkpoint
-- directory's 4): training may well have finished.
M.EXIT_STATUS = 5

M.POLICIES = { continue = true, stop = true }

-- The option the recipes share (through fsdp.observe.metrics.options).
M.OPTION = { 'continue', 'a failed write to --metrics_file, --tensorboard_dir, a --profile_steps trace or --plot: '
  .. 'continue (warn at once, train on, exit 5 at the end) or stop (end the run after that step, exit 5)',
  one_of = { 'continue', 'stop' } }

local Outputs = {}
Outputs.__index = Outputs

-- opts: policy ('continue' or 'stop'), checkpoint_dir (named when a stop
-- says where to resume from), rank/world_size (default fsdp.dist's),
-- err (the stream for the lines; io.stderr).
function M.Outputs(opts)
  opts = opts or {}
  local policy = opts.policy or 'continue'
  if not M.POLICIES[policy] then
    error(("fsdp.observe.outputs: --on_output_error must be continue or stop, got '%s'"):format(tostring(policy)), 2)
  end
  return setmetatable({
    policy = policy, checkpoint_dir = opts.checkpoint_dir, failures = {}, by_what = {},
    rank = opts.rank or dist.rank(), world_size = opts.world_size or dist.world_size(), err = opts.err or io.stderr,
  }, Outputs)
end

-- A message without "file:line: " and a library's "fsdp.x: " (the option
-- says which output it is).
local function bare(msg)
  return (tostring(msg):gsub('^[^:\n]+:%d+: ', ''):gsub('^fsdp%.[%w_.]+: ', ''))
end

local function set_exit_status()
  local ok, host = pcall(require, 'fsdp.host')
  if ok and type(host) == 'table' and host.set_exit_status then host.set_exit_status(M.EXIT_STATUS) end
end

-- Whether `what` (an option name: 'metrics_file', ...) still takes writes.
function Outputs:ok(what) return not self.by_what[what] end

-- Record that writing `what` (at `path`; `step`, the step being written,
-- or nil) failed with `err`: the warning line, the exit status, and no
-- more writes to it.
function Outputs:fail(what, path, step, err)
  if self.by_what[what] then return end
  local why = bare(err)
  local f = { what = what, path = path, step = step, why = why, rank = self.rank }
  self.by_what[what] = f
  self.failures[#self.failures + 1] = f
  set_exit_status()
  local after = self.policy == 'stop' and 'the run stops after this step (--on_output_error=stop)'
    or ('the run goes on and will exit with status %d'):format(M.EXIT_STATUS)
  io.stdout:flush()
  self.err:write(('%sfsdp-lua: warning: --%s: %s%s; nothing more is written there; %s\n'):format(
    self.world_size > 1 and ('[rank %d] '):format(self.rank) or '', what,
    step and ('writing step %d: '):format(step) or '', why, after))
  self.err:flush()
end

-- fn() writes to `what` at `path`; a failure goes to fail(). Returns
-- whether it was written (false at once once `what` has failed).
function Outputs:write(what, path, step, fn, ...)
  if self.by_what[what] then return false end
  local ok, err = pcall(fn, ...)
  if not ok then self:fail(what, path, step, err) end
  return ok
end

-- "--metrics_file m.jsonl from step 12" for one failure.
local function describe(f, world)
  local who = world > 1 and f.rank ~= 0 and (" (rank %d's)"):format(f.rank) or ''
  return ('--%s %s%s%s'):format(f.what, f.path or '', who, f.step and (' from step %d'):format(f.step) or '')
end

-- With --on_output_error=stop: after step `step`, every rank calls this;
-- if a write failed on any rank the run ends here on all of them (one line
-- from rank 0, exit EXIT_STATUS). Nothing to do (no collective) otherwise.
function Outputs:check_stop(step)
  if self.policy ~= 'stop' then return end
  local failed = #self.failures > 0
  if self.world_size > 1 then
    local t = factories.tensor({ failed and 1 or 0 }, { dtype = 'f64' })
    failed = dist.all_reduce(t, { op = 'max' }):item() > 0
  end
  if not failed then return end
  if self.rank == 0 then
    local text = ('stopped after step %d: a write to an output failed (--on_output_error=stop)'):format(step)
    if self.failures[1] then text = text .. ': ' .. describe(self.failures[1], self.world_size) end
    text = text .. checkpointing.resume_hint(self.checkpoint_dir)
    io.stdout:flush()
    self.err:write('fsdp-lua: ', text, '\n')
    self.err:flush()
  end
  io.stdout:flush()
  -- No rank exits before rank 0 has written: the launcher ends the job at
  -- the first rank that exits non-zero.
  if self.world_size > 1 then dist.barrier() end
  os.exit(M.EXIT_STATUS, true)
end

-- At the end of the run (every rank): the ranks' failures are gathered;
-- when there are any, rank 0 prints one line naming them and every rank
-- will exit with EXIT_STATUS. Returns the failures (every rank's).
function Outputs:close()
  local all = {}
  if self.world_size > 1 then
    local mine = json.encode(json.array(self.failures))
    for _, text in ipairs(dist.all_gather_strings(mine)) do
      for _, f in ipairs(json.decode(text)) do all[#all + 1] = f end
    end
  else
    all = self.failures
  end
  if #all == 0 then return all end
  set_exit_status()
  if self.rank == 0 then
    local parts = {}
    for i, f in ipairs(all) do parts[i] = describe(f, self.world_size) end
    io.stdout:flush()
    self.err:write(('fsdp-lua: output lost: %s (first failure: %s); exit status %d at the end\n'):format(
      table.concat(parts, ', '), all[1].why, M.EXIT_STATUS))
    self.err:flush()
  end
  return all
end

return M
