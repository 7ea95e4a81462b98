-- fsdp.checkpointing.load: a sharded checkpoint back into a model, its
-- optimizer, scheduler, data position and RNG, resharding on the way.
--
-- For each parameter slice this rank holds now (fsdp.checkpointing.parts),
-- the saved part holding that parameter is found by name, the slice's
-- global range is its saved offset plus the slice's first element, and
-- parts.pieces() says which saved ranks' files hold which pieces of it.
-- Files are memory-mapped (fsdp.safetensors) and each piece is copied from
-- the mapping into place, so a rank touches only the pages of its share
-- whatever the saved world size, strategy or wrap. Optimizer state is
-- stored over the same slices and comes back the same way, per parameter
-- name, for the parameters this rank holds elements of (with the scalars
-- their holders saved, fsdp.checkpointing.optim_state); the optimizer
-- regroups it into its fused runs on the next step.
local core = require 'fsdp.core'
local factories = require 'fsdp.factories'
local dist = require 'fsdp.dist'
local random = require 'fsdp.random'
local autograd = require 'fsdp.autograd'
local safetensors = require 'fsdp.io.safetensors'
local files = require 'fsdp.io.files'
local parts_of = require 'fsdp.checkpointing.parts'
local directory = require 'fsdp.checkpointing.directory'
local progress = require 'fsdp.observe.progress'

local M = {}

-- Open saved rank files on first use, each once.
local function file_cache(step_dir, index)
  local open = {}
  local cache = {}
  function cache.get(rank, key)
    local f = open[rank]
    if not f then
      local path = files.join(step_dir, index.ranks[rank + 1].file)
      if files.mode(path) ~= 'file' then
        core.fail(('checkpoint %s: %s is missing (rank %d of %d saved it)'):format(step_dir, path, rank,
          index.world_size))
      end
      f = safetensors.open(path)
      open[rank] = f
    end
    if not f:has(key) then
      core.fail(('checkpoint %s: %s holds no tensor %s, which the index says it saved'):format(step_dir,
        f.path, key))
    end
    return f:get(key)
  end
  function cache.close()
    for _, f in pairs(open) do f:close() end
  end
  return cache
end

-- Copy saved elements [first, first + dst:numel()) of the saved part's
-- tensor `suffix` ('' the values, '#exp_avg' a state) into dst.
local function copy_range(cache, saved_part, suffix, first, dst, what)
  local n = dst:numel()
  if n == 0 then return end
  for _, pc in ipairs(parts_of.pieces(saved_part, first, n, what)) do
    local src = cache.get(pc.rank, saved_part.key .. suffix)
    if src:numel() < pc.src + pc.len then
      core.fail(('checkpoint: %s: the saved %s%s of rank %d has %d elements, the index promises %d')
        :format(what, saved_part.key, suffix, pc.rank, src:numel(), pc.src + pc.len))
    end
    dst:narrow(0, pc.dst, pc.len):copy_(src:narrow(0, pc.src, pc.len))
    src:free() -- the mapping is released with the file, not at collection
  end
end

local function load_model(cache, index, objs, opt_state)
  local saved = parts_of.saved_params(index)
  local seen, missing = {}, {}
  local want_optim = {}
  if objs.optimizer then
    for _, g in ipairs(objs.optimizer.param_groups) do
      for _, name in ipairs(g.names) do want_optim[name] = true end
    end
  end
  local saved_optim = index.optimizer and index.optimizer.state or {}
  local parts = parts_of.of(objs.model)
  local n = 0
  for _, part in ipairs(parts) do n = n + #part.params end
  local bar = progress.start(('checkpoint: loading %s'):format(index.path), { total = n, unit = 'parameters' })
  local ok, err = pcall(function()
    for _, part in ipairs(parts) do
      for _, p in ipairs(part.params) do
        local s = saved[p.name]
        if not s then
          missing[#missing + 1] = p.name
        else
          seen[p.name] = true
          if core.format_shape(s.shape) ~= core.format_shape(p.shape) then
            core.fail(('checkpoint %s: parameter %s is %s in the checkpoint, %s in the model')
              :format(index.path, p.name, core.format_shape(s.shape), core.format_shape(p.shape)))
          end
          local first = s.offset + p.param_start
          local what = 'parameter ' .. p.name
          copy_range(cache, s.part, '', first, part.flat:narrow(0, p.shard_start, p.len), what)
          -- state only where this rank holds elements ([Note: optimizer
          -- state is saved by the ranks that hold the parameter])
          if want_optim[p.name] and saved_optim[p.name] and p.len > 0 then
            local st = {}
            for k, v in pairs(saved_optim[p.name]) do st[k] = v end
            for k, dtype in pairs(s.part.optim or {}) do
              local t = factories.zeros({ p.len }, { dtype = dtype })
              copy_range(cache, s.part, '#' .. k, first, t, what .. ' (optimizer ' .. k .. ')')
              -- a whole (unsharded) parameter's state has its shape
              st[k] = part.kind == 'unit' and t or t:view(p.shape)
            end
            opt_state[p.name] = st
          end
        end
        bar:add(1)
      end
    end
  end)
  bar:finish(not ok and 'failed' or nil)
  if not ok then error(err, 0) end
  if #missing > 0 and objs.strict ~= false then
    core.fail(('checkpoint %s lacks parameters of the model: %s'):format(index.path, table.concat(missing, ', ')))
  end
  local unexpected = {}
  for name in pairs(saved) do
    if not seen[name] then unexpected[#unexpected + 1] = name end
  end
  table.sort(unexpected)
  if #unexpected > 0 and objs.strict ~= false then
    core.fail(('checkpoint %s has parameters the model lacks: %s'):format(index.path, table.concat(unexpected, ', ')))
  end
end

-- This rank's saved per-rank state: its own when the world size is the
-- same, else rank 0's (data positions are global, so any rank's is right).
local function rank_state(index)
  local r = index.world_size == dist.world_size() and dist.rank() or 0
  return index.ranks[r + 1]
end

-- A LoRA checkpoint loads into adapters with the same rank, alpha,
-- rslora and targets: the scaling alpha/rank is no parameter, so another
-- one would silently change what the loaded adapters compute.
local function describe_lora(l)
  if not l then return 'no LoRA adapters' end
  return ('LoRA rank %s, alpha %s%s on %s'):format(tostring(l.rank), tostring(l.alpha), l.rslora and ' (rslora)' or '',
    table.concat(l.targets or {}, ','))
end

local function check_lora(index, model)
  local want = rawget(model, '_lora') and directory.lora_settings(rawget(model, '_lora')) or nil
  local have = index.lora
  local same = (want == nil) == (have == nil)
  if same and want then
    same = want.rank == have.rank and want.alpha == have.alpha and want.rslora == have.rslora
      and table.concat(want.targets, ',') == table.concat(have.targets or {}, ',')
  end
  if not same then
    core.fail(('checkpoint %s was saved with %s; the model has %s'):format(index.path, describe_lora(have),
      describe_lora(want)))
  end
end

-- A refusal every rank raised alike (M.is_refusal): the caller may end the
-- job with one line, as no rank goes on alone.
local Refusal = { __tostring = function(self) return self.message end }
function M.is_refusal(e) return getmetatable(e) == Refusal end

-- The data position goes back first: a source whose files changed since
-- the save refuses it ([Note: the fingerprint of a data position] in
-- lua/fsdp/data/corpus.lua), and that must come before any tensor is
-- read. The ranks agree on the outcome (the first rank's error, in rank
-- order, is raised on every rank: rank 0's position names the files of a
-- changed listing), so the job ends with one message and no rank goes on
-- alone into a collective.
local function load_data(index, data, mine)
  local err
  if type(mine.data) ~= 'table' then
    err = ('checkpoint %s: the index holds no data position'):format(index.path)
  else
    local ok, e = pcall(data.load_state, data, mine.data)
    if not ok then err = (tostring(e):gsub('^[^%s:]+:%d+: ', '')) end
  end
  if dist.world_size() > 1 then
    local first
    for _, e in ipairs(dist.all_gather_strings(err or '')) do
      if e ~= '' then first = e; break end
    end
    err = first
  end
  if err then error(setmetatable({ message = err }, Refusal), 0) end
end

function M.load(step_dir, index, objs)
  local opt = objs.optimizer
  if opt and not index.optimizer then
    core.fail(('checkpoint %s: the index holds no optimizer state'):format(index.path))
  end
  if opt and index.optimizer.class ~= opt.name then
    core.fail(('checkpoint %s: the optimizer state is %s\'s, the optimizer is %s'):format(index.path,
      tostring(index.optimizer.class), opt.name))
  end
  if objs.scheduler and type(index.scheduler) ~= 'table' then
    core.fail(('checkpoint %s: the index holds no scheduler state'):format(index.path))
  end
  check_lora(index, objs.model)
  local mine = rank_state(index)
  if objs.data then load_data(index, objs.data, mine) end
  local cache = file_cache(step_dir, index)
  local opt_state = {}
  local ok, err = pcall(autograd.no_grad, function() load_model(cache, index, objs, opt_state) end)
  cache.close()
  if not ok then error(err, 0) end
  if opt then
    local ok2, err2 = pcall(opt.load_state_dict, opt, { state = opt_state, param_groups = index.optimizer.param_groups })
    if not ok2 then core.fail(('checkpoint %s: %s'):format(index.path, tostring(err2))) end
  end
  if objs.scheduler then objs.scheduler:load_state_dict(index.scheduler) end
  -- weights_only (--init_from): a new run keeps its own random stream.
  if type(mine.rng) == 'table' and not objs.weights_only then random.set_state(mine.rng) end
end

return M
