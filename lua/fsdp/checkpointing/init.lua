-- fsdp.checkpointing: sharded checkpoints to resume training from, on the
-- same or another number of ranks, and the streamed full state dict.
--
--   local ckpt = require 'fsdp.checkpointing'
--   ckpt.save('ckpt', {model = m, optimizer = opt, scheduler = sched, data = data,
--                      step = 120, extra = {...}, keep = 2})   -- collective
--   local dir = ckpt.latest('ckpt')                            -- newest complete, or nil
--   local info = ckpt.load('ckpt', {model = m, optimizer = opt, scheduler = sched, data = data})
--   for step = info.step + 1, max_steps do ... end
--   ckpt.save_full_state_dict('model.safetensors', m)          -- HF names, one unit at a time
--
-- A save writes <dir>/step-000120/ (fsdp.checkpointing.layout): every rank
-- its own safetensors file with its slice of every part
-- (fsdp.checkpointing.parts: a unit's master shard, or a whole unsharded
-- tensor) and the optimizer's state over the same slice, one tensor per
-- part and state key: "unit:model.layers.0", "unit:model.layers.0#exp_avg".
-- Rank 0 then writes index.json (world size, strategy, every part's
-- parameters with shapes and offsets and the slices each rank saved; the
-- step, the optimizer's hyper-parameters and per-parameter counters, the
-- scheduler, each rank's data position and RNG state, `extra`) and last
-- COMPLETE. A load maps the saved files and copies into each of this
-- rank's parameter slices the saved ranges that hold it, found by
-- parameter name and element offset, so no rank reads more than its share.
local core = require 'fsdp.core'
local fsdp = require 'fsdp'
local Tensor = require 'fsdp.tensor'
local dist = require 'fsdp.dist'
local random = require 'fsdp.random'
local autograd = require 'fsdp.autograd'
local files = require 'fsdp.files'
local json = require 'fsdp.json'
local layout = require 'fsdp.checkpointing.layout'
local parts_of = require 'fsdp.checkpointing.parts'
local optim_state = require 'fsdp.checkpointing.optim_state'
local C = core.C

local M = {}
M.layout = layout

function M.latest(dir) return layout.latest(dir) end

local function barrier() if dist.world_size() > 1 then dist.barrier() end end

-- Test hook (tests/mpi/ckpt_recipe.sh): FSDP_TEST_KILL_IN_SAVE=N kills
-- rank 0 with SIGKILL in the middle of the save of step N, after every
-- rank's file and the index are written and before COMPLETE.
function M.kill_self(why)
  io.stdout:write(('[rank %d] test hook: kill -9 (%s)\n'):format(dist.rank(), why))
  io.stdout:flush()
  local f = io.open('/proc/self/stat', 'r')
  local pid = f and f:read('*n')
  if f then f:close() end
  if pid then os.execute('kill -9 ' .. pid) end
  core.fail('kill_self: the process survived kill -9 ' .. tostring(pid))
end

local function check_objs(objs, what)
  if type(objs) ~= 'table' or objs.model == nil then
    core.fail(('checkpointing.%s expects {model =, optimizer =, scheduler =, data =%s}'):format(
      what, what == 'save' and ', step =' or ''))
  end
end

local function sorted(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

-- This rank's file: for every part it writes, the slice and one flat
-- tensor per optimizer state key (built per key while writing, so only one
-- unit's state is ever copied at a time).
local function write_rank_file(path, parts, opt)
  local w = C.fl_safetensors_writer_new(path)
  if w == nil then core.raise() end
  local written, scalars = {}, {}
  local ok, err = pcall(function()
    local plan = {}
    for _, part in ipairs(parts) do
      local keys, sc = optim_state.of_part(opt, part)
      for name, s in pairs(sc) do scalars[name] = s end
      if part.writer then
        local c = Tensor.cptr(part.flat)
        core.check(C.fl_safetensors_writer_declare(w, part.key, c.dtype, 1, c.shape))
        local names = sorted(keys)
        for _, k in ipairs(names) do
          local shape = core.ffi.new('int64_t[1]', part.len)
          core.check(C.fl_safetensors_writer_declare(w, part.key .. '#' .. k, core.dtype(keys[k]), 1, shape))
        end
        plan[#plan + 1] = { part = part, keys = names, dtypes = keys }
        written[part.key] = { start = part.start, len = part.len, optim = keys }
      end
    end
    core.check(C.fl_safetensors_writer_metadata(w, 'format', layout.FORMAT))
    for _, e in ipairs(plan) do
      core.check(C.fl_safetensors_writer_write(w, Tensor.cptr(e.part.flat)))
      for _, k in ipairs(e.keys) do
        local flat = fsdp.zeros({ e.part.len }, { dtype = e.dtypes[k] })
        for _, p in ipairs(e.part.params) do
          local st = opt.state[p.name]
          if p.len > 0 and st and st[k] ~= nil then
            flat:narrow(0, p.shard_start, p.len):copy_(st[k]:reshape(-1))
          end
        end
        core.check(C.fl_safetensors_writer_write(w, Tensor.cptr(flat)))
        flat:free()
      end
    end
    core.check(C.fl_safetensors_writer_finish(w))
  end)
  C.fl_safetensors_writer_free(w) -- removes the temporary file of a failed write at once
  if not ok then error(err, 0) end
  return written, scalars
end

-- Save a sharded checkpoint of step objs.step under dir (collective: every
-- rank calls it). objs: model (required), optimizer, scheduler, data
-- (anything with state()), step (integer), extra (a JSON-able table),
-- keep (delete complete checkpoints beyond the newest `keep`; 0/nil: keep
-- all). Returns the step directory.
function M.save(dir, objs)
  check_objs(objs, 'save')
  local step = objs.step
  if type(step) ~= 'number' or step < 0 or step ~= math.floor(step) then
    core.fail(('checkpointing.save: step must be an integer >= 0, got %s'):format(tostring(step)))
  end
  local rank, world = dist.rank(), dist.world_size()
  local step_dir = layout.step_dir(dir, step)
  if rank == 0 then
    -- A directory of this step from an interrupted save is replaced.
    files.mkdir_p(dir, 'checkpointing.save')
    if files.mode(step_dir) then files.remove_tree(step_dir, layout.COMPLETE) end
    files.mkdir_p(step_dir, 'checkpointing.save')
    files.fsync(dir)
  end
  barrier()
  local parts = parts_of.of(objs.model)
  local file = layout.rank_file(rank, world)
  local written, scalars = autograd.no_grad(function()
    return write_rank_file(files.join(step_dir, file), parts, objs.optimizer)
  end)
  local mine = json.encode({
    file = file, written = written, optim = scalars, rng = random.get_state(),
    data = objs.data and objs.data:state() or nil,
  })
  local all = dist.all_gather_strings(mine) -- every rank's file is in place past this point
  local descs = {}
  for r = 0, world - 1 do descs[r] = json.decode(all[r + 1]) end
  -- on every rank, so that ranks disagreeing on a parameter's optimizer
  -- scalars all fail here ([Note: optimizer state is saved by the ranks
  -- that hold the parameter])
  local reports = {}
  for r = 0, world - 1 do reports[r] = descs[r].optim end
  local optim_scalars = optim_state.merge(reports, world, step_dir)
  if rank == 0 then
    local index = {
      format = layout.FORMAT, version = layout.VERSION, step = step, world_size = world,
      strategy = rawget(objs.model, '_fsdp') and rawget(objs.model, '_fsdp').strategy or 'unsharded',
      parts = {}, ranks = {}, extra = objs.extra,
      scheduler = objs.scheduler and objs.scheduler:state_dict() or nil,
    }
    for i, part in ipairs(parts) do
      local entry = parts_of.describe(part)
      for r = 0, world - 1 do
        local w = descs[r].written[part.key]
        if w then
          entry.shards[#entry.shards + 1] = { rank = r, start = w.start, len = w.len }
          for k, dt in pairs(w.optim) do entry.optim[k] = dt end
        end
      end
      index.parts[i] = entry
    end
    for r = 0, world - 1 do
      index.ranks[r + 1] = { file = descs[r].file, rng = descs[r].rng, data = descs[r].data }
    end
    if objs.optimizer then
      local sd = objs.optimizer:state_dict()
      index.optimizer = { class = objs.optimizer.name, param_groups = sd.param_groups, state = optim_scalars }
    end
    files.write_atomic(files.join(step_dir, layout.INDEX), json.encode(index))
    if os.getenv('FSDP_TEST_KILL_IN_SAVE') == tostring(step) then
      M.kill_self('FSDP_TEST_KILL_IN_SAVE=' .. step .. ': files written, COMPLETE not yet')
    end
    files.write_atomic(files.join(step_dir, layout.COMPLETE), ('step %d, %d ranks\n'):format(step, world))
    if objs.keep then layout.prune(dir, objs.keep, step) end
  end
  barrier()
  return step_dir
end

-- The step directory a load reads: `path` itself when it holds an index
-- (it must be complete), else the newest complete one under it.
function M.resolve(path)
  if type(path) ~= 'string' or path == '' then core.fail('checkpointing.load: path must be a directory') end
  if files.mode(files.join(path, layout.INDEX)) == 'file' then
    if not layout.is_complete(path) then
      core.fail(('checkpointing.load: %s has no %s: the save was interrupted; load an earlier step')
        :format(path, layout.COMPLETE))
    end
    return path
  end
  if files.mode(path) ~= 'directory' then core.fail(('checkpointing.load: %s: no such directory'):format(path)) end
  local latest = layout.latest(path)
  if not latest then core.fail(('checkpointing.load: %s holds no complete checkpoint'):format(path)) end
  return latest
end

local load_sharded = require 'fsdp.checkpointing.load'

-- Load a checkpoint (a step directory, or the newest complete one under a
-- checkpoint directory) into objs.model and, when given, objs.optimizer,
-- objs.scheduler, objs.data (collective only in that every rank reads its
-- own share). The saved world size, strategy and wrap may differ from the
-- current ones (matched by parameter names and offsets). Returns {step=,
-- extra=, dir=, world_size=, strategy=}.
function M.load(path, objs)
  check_objs(objs, 'load')
  local step_dir = M.resolve(path)
  local index = layout.read_index(step_dir)
  load_sharded.load(step_dir, index, objs)
  return { step = index.step, extra = index.extra, dir = step_dir, world_size = index.world_size,
           strategy = index.strategy }
end

M.save_full_state_dict = function(...) return require('fsdp.checkpointing.full').save_full_state_dict(...) end

return M
