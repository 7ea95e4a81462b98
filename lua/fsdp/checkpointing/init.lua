-- fsdp.checkpointing: sharded checkpoints to resume training from, on the
-- same or another number of ranks, and the streamed full state dict.
--
--   local ckpt = require 'fsdp.checkpointing'
--   ckpt.save('ckpt', {model = m, optimizer = opt, scheduler = sched, data = data,
--                      step = 120, extra = {...}, keep = 2})   -- collective
--   local dir = ckpt.latest('ckpt')                            -- newest complete, or nil
--   local index, why = ckpt.check(dir)                         -- collective: files intact?
--   local info = ckpt.load('ckpt', {model = m, optimizer = opt, scheduler = sched, data = data})
--   for step = info.step + 1, max_steps do ... end
--   ckpt.save_full_state_dict('model.safetensors', m)          -- HF names, one unit at a time
--
-- A save writes <dir>/step-000120/ (fsdp.checkpointing.directory): every rank
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
--
-- Nothing loads silently wrong: every rank file carries the checksum of its
-- tensor data, the step, the run and its rank (fsdp.checkpointing.directory),
-- and a load first checks every file against the index (check(): each
-- file once, by one rank, verdict shared by all ranks), refusing a damaged,
-- swapped or stale file with one message naming it. A save refuses
-- parameters and optimizer state holding NaN or infinity, so no checkpoint
-- is ever written from a diverged run.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local factories = require 'fsdp.factories'
local Tensor = require 'fsdp.tensor'
local dist = require 'fsdp.dist'
local random = require 'fsdp.random'
local autograd = require 'fsdp.autograd'
local files = require 'fsdp.io.files'
local json = require 'fsdp.io.json'
local directory = require 'fsdp.checkpointing.directory'
local parts_of = require 'fsdp.checkpointing.parts'
local safetensors = require 'fsdp.io.safetensors'
local optim_state = require 'fsdp.checkpointing.optim_state'
local progress = require 'fsdp.observe.progress'
local lock = require 'fsdp.checkpointing.lock'
local console = require 'fsdp.observe.console'
local load_sharded = require 'fsdp.checkpointing.load'
local full = require 'fsdp.checkpointing.full'
local tables = require 'fsdp.tables'
local C = core.C
local META = directory.META

local M = {}
M.directory = directory

-- ckpt.latest(dir): the newest complete step directory of dir and its
-- step, or nil; third, the incomplete directories newer than it (a save
-- that crashed), which were skipped.
function M.latest(dir) return directory.latest(dir) end

-- Where a stopped run can go on from, as a clause its message ends with:
-- "; the newest checkpoint is DIR/step-N", "; DIR holds no complete
-- checkpoint", or '' when the run keeps none (dir nil or '').
function M.resume_hint(dir)
  if dir == nil or dir == '' then return '' end
  local latest = M.latest(dir)
  if latest then return ('; the newest checkpoint is %s'):format(latest) end
  return ('; %s holds no complete checkpoint'):format(dir)
end


-- An error message without the "file:line: " a raise put in front: it is
-- passed on to other ranks and raised again with the caller's position.
local function bare(msg) return (tostring(msg):gsub('^[^%s:]+:%d+: ', '')) end

-- The first error any rank had (err: this rank's, or nil), the same on
-- every rank, so all ranks take the same branch and none waits alone in a
-- collective.
local function agree(err)
  if dist.world_size() == 1 then return err end
  for r, e in ipairs(dist.all_gather_strings(err or '')) do
    if e ~= '' then return e, r - 1 end
  end
end

-- The run a save belongs to: a random id made at a fresh start and kept
-- across resumes (load() adopts the loaded checkpoint's), so a file copied
-- from another run's checkpoint is told from this run's own.
local function new_run_id()
  local f = assert(io.open('/dev/urandom', 'rb'))
  local bytes = f:read(8)
  f:close()
  return (bytes:gsub('.', function(c) return ('%02x'):format(c:byte()) end))
end

-- The id of the run this process saves for (made at its first save or
-- taken from the checkpoint it loaded), or nil before either.
function M.run_id() return M._run end

-- objs.run when given, else this process's run (made by rank 0 at the
-- first save and shared: collective).
local function run_of(objs)
  if objs.run ~= nil then return tostring(objs.run) end
  if not M._run then
    local id = dist.rank() == 0 and new_run_id() or ''
    if dist.world_size() > 1 then id = dist.all_gather_strings(id)[1] end
    M._run = id
  end
  return M._run
end

-- Test hook (tests/mpi/ckpt_recipe.sh): FSDP_TEST_KILL_IN_SAVE=N kills
-- rank 0 with SIGKILL in the middle of the save of step N, after every
-- rank's file and the index are written and before COMPLETE.
function M.kill_self(why)
  io.stdout:write(('[rank %d] test hook: kill -9 (%s)\n'):format(dist.rank(), why))
  io.stdout:flush()
  local ffi = require 'ffi'
  pcall(ffi.cdef, 'int getpid(void); int kill(int pid, int sig);')
  local pid = ffi.C.getpid()
  ffi.C.kill(pid, 9)
  core.fail('kill_self: the process survived kill -9 ' .. tostring(pid))
end

local function check_objs(objs, what)
  if type(objs) ~= 'table' or objs.model == nil then
    core.fail(('checkpointing.%s expects {model =, optimizer =, scheduler =, data =%s}'):format(
      what, what == 'save' and ', step =' or ''))
  end
end

local sorted = tables.sorted_keys

-- This rank's file: for every part it writes, the slice and one flat
-- tensor per optimizer state key (built per key while writing, so only one
-- unit's state is ever copied at a time). `meta`: the integrity metadata;
-- the writer checksums the data and refuses non-finite parameters and
-- optimizer state (buffers such as masks may hold infinities). Returns the
-- parts written, the optimizer's scalars and the file's checksum.
local function write_rank_file(path, parts, opt, meta, label)
  local w = C.fl_safetensors_writer_new(path)
  if w == nil then core.raise() end
  local written, scalars, checksum = {}, {}, nil
  local bar
  local ok, err = pcall(function()
    local plan, total = {}, 0
    for _, part in ipairs(parts) do
      local keys, sc = optim_state.of_part(opt, part)
      for name, s in pairs(sc) do scalars[name] = s end
      if part.writer then
        local c = Tensor.cptr(part.flat)
        core.check(C.fl_safetensors_writer_declare(w, part.key, c.dtype, 1, c.shape))
        total = total + tonumber(c.numel) * tonumber(C.fl_dtype_size(c.dtype))
        local names = sorted(keys)
        for _, k in ipairs(names) do
          total = total + part.len * tonumber(C.fl_dtype_size(core.dtype(keys[k])))
          local shape = core.ffi.new('int64_t[1]', part.len)
          core.check(C.fl_safetensors_writer_declare(w, part.key .. '#' .. k, core.dtype(keys[k]), 1, shape))
        end
        plan[#plan + 1] = { part = part, keys = names, dtypes = keys }
        written[part.key] = { start = part.start, len = part.len, optim = keys }
      end
    end
    core.check(C.fl_safetensors_writer_metadata(w, 'format', directory.FORMAT))
    for k, v in pairs(meta) do core.check(C.fl_safetensors_writer_metadata(w, META[k], tostring(v))) end
    core.check(C.fl_safetensors_writer_checksum(w))
    -- rank 0's file stands for every rank's (fsdp.observe.progress)
    bar = progress.start(label, { total = total, unit = 'B' })
    for _, e in ipairs(plan) do
      core.check(C.fl_safetensors_writer_finite(w, e.part.kind ~= 'buffer'))
      local c = Tensor.cptr(e.part.flat)
      core.check(C.fl_safetensors_writer_write(w, c))
      bar:add(tonumber(c.numel) * tonumber(C.fl_dtype_size(c.dtype)))
      core.check(C.fl_safetensors_writer_finite(w, true))
      for _, k in ipairs(e.keys) do
        local flat = factories.zeros({ e.part.len }, { dtype = e.dtypes[k] })
        for _, p in ipairs(e.part.params) do
          local st = opt.state[p.name]
          if p.len > 0 and st and st[k] ~= nil then
            flat:narrow(0, p.shard_start, p.len):copy_(st[k]:reshape(-1))
          end
        end
        core.check(C.fl_safetensors_writer_write(w, Tensor.cptr(flat)))
        bar:add(e.part.len * tonumber(C.fl_dtype_size(core.dtype(e.dtypes[k]))))
        flat:free()
      end
    end
    core.check(C.fl_safetensors_writer_finish(w))
    checksum = core.ffi.string(C.fl_safetensors_writer_checksum_value(w))
  end)
  C.fl_safetensors_writer_free(w) -- removes the temporary file of a failed write at once
  if bar then bar:finish(not ok and 'failed' or nil) end
  if not ok then error(err, 0) end
  return written, scalars, checksum
end

-- Save a sharded checkpoint of step objs.step under dir (collective: every
-- rank calls it). objs: model (required), optimizer, scheduler, data
-- (anything with state()), step (integer), extra (a JSON-able table),
-- keep (delete complete checkpoints beyond the newest `keep`; 0/nil: keep
-- all), run (the run id; default: the resumed checkpoint's, or a fresh
-- one). Fails on every rank, writing no COMPLETE, when any rank fails,
-- e.g. on a NaN in its shard, and when another job holds the directory
-- (fsdp.checkpointing.lock, taken at the first save). Returns the step
-- directory.
function M.save(dir, objs)
  check_objs(objs, 'save')
  local step = objs.step
  if validate.problem(step, validate.INDEX) then
    core.fail(('checkpointing.save: step must be an integer >= 0, got %s'):format(validate.show(step)))
  end
  -- The directory is this job's before anything in it changes ([Note: one
  -- job per checkpoint directory]); once per directory, then a table look-up.
  lock.acquire(dir)
  local rank, world = dist.rank(), dist.world_size()
  local run = run_of(objs)
  local step_dir = directory.step_dir(dir, step)
  -- Rank 0's parts (the step directory here, the index and COMPLETE
  -- below) can fail alone, on a full disk say: each is followed by an
  -- agreement instead of a barrier, so every rank fails the save alike
  -- rather than wait in a collective rank 0 never reaches.
  local function on_rank0(fn)
    local err
    if rank == 0 then
      local ok, e = pcall(fn)
      if not ok then err = bare(e) end
    end
    err = agree(err)
    if err then core.fail(('checkpointing.save: step %d not saved (rank 0 failed): %s'):format(step, err)) end
  end
  on_rank0(function()
    files.mkdir_p(dir, 'checkpointing.save')
    local mode = files.lmode(step_dir)
    if mode == 'directory' then
      -- A directory of this step from an interrupted or earlier save: its
      -- own files go, stray ones stay.
      directory.remove_checkpoint(step_dir)
    elseif mode then
      -- A file or link where this save's directory goes: moved aside
      -- (never followed, nothing deleted).
      local aside = ('%s.moved-aside-%d'):format(step_dir, os.time())
      local ok, err = os.rename(step_dir, aside)
      if not ok then core.fail(('checkpointing.save: %s is a %s and cannot be moved aside: %s'):format(step_dir, mode, err)) end
      io.stderr:write(('%scheckpoint: %s was a %s, not a checkpoint: moved to %s\n'):format(
        console.prefix(), step_dir, mode, aside))
    end
    files.mkdir_p(step_dir, 'checkpointing.save')
    files.fsync(dir)
  end)
  local parts = parts_of.of(objs.model)
  local file = directory.rank_file(rank, world)
  local ok, written, scalars, checksum = pcall(autograd.no_grad, function()
    return write_rank_file(files.join(step_dir, file), parts, objs.optimizer,
      { step = step, run = run, rank = rank, world = world }, ('checkpoint: saving %s'):format(step_dir))
  end)
  local mine = ok and json.encode({
    file = file, written = written, optim = scalars, rng = random.get_state(), checksum = checksum,
    data = objs.data and objs.data:state() or nil,
  }) or json.encode({ error = bare(written) })
  local all = dist.all_gather_strings(mine) -- every rank's file is in place past this point
  local descs = {}
  for r = 0, world - 1 do
    descs[r] = json.decode(all[r + 1])
    if descs[r].error then
      core.fail(('checkpointing.save: step %d not saved (rank %d failed): %s'):format(step, r, descs[r].error))
    end
  end
  -- on every rank, so that ranks disagreeing on a parameter's optimizer
  -- scalars all fail here ([Note: optimizer state is saved by the ranks
  -- that hold the parameter])
  local reports = {}
  for r = 0, world - 1 do reports[r] = descs[r].optim end
  local optim_scalars = optim_state.merge(reports, world, step_dir)
  on_rank0(function()
    local index = {
      format = directory.FORMAT, version = directory.VERSION, step = step, world_size = world, run = run,
      strategy = rawget(objs.model, '_fsdp') and rawget(objs.model, '_fsdp').strategy or 'unsharded',
      parts = {}, ranks = {}, extra = objs.extra,
      scheduler = objs.scheduler and objs.scheduler:state_dict() or nil,
      -- The adapters' scaling is no parameter: kept so a resume with other
      -- settings is refused (load.lua), not trained on silently changed.
      lora = rawget(objs.model, '_lora') and directory.lora_settings(rawget(objs.model, '_lora')) or nil,
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
      index.ranks[r + 1] = { file = descs[r].file, checksum = descs[r].checksum, rng = descs[r].rng,
                             data = descs[r].data }
    end
    if objs.optimizer then
      local sd = objs.optimizer:state_dict()
      index.optimizer = { class = objs.optimizer.name, param_groups = sd.param_groups, state = optim_scalars }
    end
    files.write_atomic(files.join(step_dir, directory.INDEX), json.encode(index))
    if os.getenv('FSDP_TEST_KILL_IN_SAVE') == tostring(step) then
      M.kill_self('FSDP_TEST_KILL_IN_SAVE=' .. step .. ': files written, COMPLETE not yet')
    end
    files.write_atomic(files.join(step_dir, directory.COMPLETE), ('step %d, %d ranks\n'):format(step, world))
    if objs.keep then
      for _, note in ipairs(select(2, directory.prune(dir, objs.keep, step))) do
        io.stderr:write(('%scheckpoint: pruning %s\n'):format(console.prefix(), note))
      end
    end
  end)
  return step_dir
end

-- The step directory a load reads: `path` itself when it holds an index
-- (it must be complete), else the newest complete one under it.
function M.resolve(path)
  if type(path) ~= 'string' or path == '' then core.fail('checkpointing.load: path must be a directory') end
  if files.mode(files.join(path, directory.INDEX)) == 'file' then
    if not directory.is_complete(path) then
      core.fail(('checkpointing.load: %s has no %s: the save was interrupted; load an earlier step')
        :format(path, directory.COMPLETE))
    end
    return path
  end
  if files.mode(path) ~= 'directory' then core.fail(('checkpointing.load: %s: no such directory'):format(path)) end
  local latest = directory.latest(path)
  if not latest then core.fail(('checkpointing.load: %s holds no complete checkpoint'):format(path)) end
  return latest
end

-- Whether saved rank r's file in step_dir is the one the index describes,
-- whole: it exists as a regular file, its header parses, it was written by
-- this run at this step as rank r of the saved world, its checksum is the
-- index's, and its data hashes to it. Raises one message naming the file.
local function check_file(step_dir, index, r)
  local info = index.ranks[r + 1]
  local path = files.join(step_dir, info.file)
  local function wrong(fmt, ...) core.fail(('checkpoint %s: %s ' .. fmt):format(step_dir, path, ...)) end
  local mode = files.lmode(path)
  if mode == nil then wrong('is missing (rank %d of %d saved it)', r, index.world_size) end
  if mode ~= 'file' then wrong('is a %s, not the file rank %d saved', mode, r) end
  local f = safetensors.open(path)
  local meta = f:metadata()
  local checked = core.ffi.new('bool[1]')
  local ok = C.fl_safetensors_verify(f._h, checked) == 0
  local verify_err = not ok and core.last_error() or nil
  f:close()
  if meta[META.run] ~= index.run then
    wrong('is from another run (%s; this checkpoint is run %s)', tostring(meta[META.run]), index.run)
  end
  if meta[META.step] ~= tostring(index.step) then
    wrong('is from step %s, not step %d (a stale file)', tostring(meta[META.step]), index.step)
  end
  if meta[META.rank] ~= tostring(r) or meta[META.world] ~= tostring(index.world_size) then
    wrong('holds rank %s of %s\'s data, not rank %d of %d\'s (files swapped or renamed)',
      tostring(meta[META.rank]), tostring(meta[META.world]), r, index.world_size)
  end
  if meta[META.checksum] ~= info.checksum then
    wrong('records checksum %s, the index %s (the file was replaced after the save)',
      tostring(meta[META.checksum]), info.checksum)
  end
  if not ok then core.fail(('checkpoint %s: %s'):format(step_dir, verify_err)) end
  if not checked[0] then wrong('has no checksum') end
end

-- Check the checkpoint in step_dir before anything is loaded from it
-- (collective: every rank calls it): its index is read and each saved
-- rank file is checked (check_file) by one rank, rank i mod the world
-- size, so the checkpoint is read once in all. Returns the index, or nil
-- and the first problem any rank found (the same on every rank).
function M.check(step_dir)
  local ok, res = pcall(function()
    local index = directory.read_index(step_dir)
    if index.version >= 2 then
      for r = dist.rank(), index.world_size - 1, dist.world_size() do check_file(step_dir, index, r) end
    end
    return index
  end)
  local err = agree(not ok and bare(res) or nil)
  if err then return nil, err end
  return res
end

-- Load a checkpoint (a step directory, or the newest complete one under a
-- checkpoint directory) into objs.model and, when given, objs.optimizer,
-- objs.scheduler, objs.data (collective only in that every rank reads its
-- own share, after check(), which is collective). The saved world size,
-- strategy and wrap may differ from the current ones (matched by
-- parameter names and offsets). `index`: what check(path) returned, when
-- the caller checked already. Returns {step=, extra=, dir=, world_size=,
-- strategy=}. The run continues the loaded checkpoint's (run_id()), unless
-- objs.weights_only (a new run starting from its weights: --init_from),
-- which also leaves this process's RNG state as it is.
function M.load(path, objs, index)
  check_objs(objs, 'load')
  local step_dir = M.resolve(path)
  if not index then
    local why
    index, why = M.check(step_dir)
    if not index then core.fail(('checkpointing.load: refused: %s'):format(why)) end
  end
  load_sharded.load(step_dir, index, objs)
  if index.run and not objs.weights_only then M._run = index.run end
  return { step = index.step, extra = index.extra, dir = step_dir, world_size = index.world_size,
           strategy = index.strategy }
end

-- The whole model to one file (fsdp.save_full_state_dict, which see).
M.save_full_state_dict = function(...) return full.save_full_state_dict(...) end

return M
