-- fsdp.nonfinite: the non-finite guard of training, the part of every
-- recipe's step between loss:backward() and the next step.
--
--   local nonfinite = require 'fsdp.nonfinite'
--   local cfg = options.config(nonfinite.options(ckpt_options.options(...)), arg, script)
--   local state = {model = model, optimizer = opt, scheduler = sched, data = data}
--   state.guard = nonfinite.guard(cfg, state, script)   -- checks --on_nonfinite
--   for step = start + 1, cfg.max_steps do
--     local loss = model:loss(ids, targets)
--     loss:backward()
--     local r = state.guard:step(step, loss)   -- {loss =, grad_norm =, lr =, skipped =}
--     log:step(step, r)
--     ckpt_options.after_step(cfg, state, step)
--   end
--
-- guard:step computes the global gradient norm (fsdp.grad_norm on a
-- sharded model: a C reduction over each rank's shards, then one
-- all-reduce; also with --grad_clip=0, where nothing is clipped) and the
-- mean loss over ranks (one all-reduce). Both are reduced values, so every
-- rank sees the same bits and takes the same decision, without another
-- collective on a finite step:
--   finite: clip to grad_clip (> 0), optimizer step, scheduler step,
--           zero_grad;
--   a NaN or infinite loss or norm: find the first parameter (in
--           model:named_parameters() order) whose gradient holds a
--           non-finite element. Under FULL_SHARD a rank holds only its
--           shard of each gradient, so each rank finds its first (a C sum
--           of squares per parameter segment) and an all-reduce with min
--           agrees on it. Then by the policy:
--     'stop' (default): raise an error naming the step, the loss, the norm
--           and that parameter with its unit (a recipe's guard prints it on
--           rank 0 and exits every rank with status 3 instead: one
--           message, no abort, no traceback). Nothing of the step is
--           applied and after_step never runs, so no checkpoint holds it
--           and none is pruned because of it.
--     'skip_step': zero_grad without an optimizer or scheduler step (as
--           Megatron and DeepSpeed skip an overflowing step: the schedule
--           follows applied updates), a log line saying so; past
--           max_skips skipped steps, stop as above. The count is part of
--           the checkpoint (fsdp.checkpointing.options stores guard.skips),
--           so a resumed run continues the bound.
-- A finite gradient can still overflow in its update; before each save
-- fsdp.checkpointing.options calls guard:check_parameters(step), which stops
-- (whatever the policy) when a parameter shard holds a NaN or infinity.
--
-- Test hook: FSDP_TEST_NONFINITE_GRAD=STEP:NAME[,NAME...] fills with NaN,
-- right after the backward of step STEP, this rank's part of the gradient
-- of each named parameter (the part may be empty: then this rank sees no
-- bad element and the collective still names it); tests/mpi/nonfinite.sh.
local factories = require 'fsdp.factories'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local dist = require 'fsdp.dist'
local Module = require 'fsdp.nn.module'
local clip = require 'fsdp.optim.clip'
local Tensor = require 'fsdp.tensor'
local ffi = require 'ffi'
local sharding = require 'fsdp.sharding'
local console = require 'fsdp.observe.console'
local checkpointing = require 'fsdp.checkpointing'
local options = require 'fsdp.options'

local M = {}

M.POLICIES = { stop = true, skip_step = true }

-- The exit status of a run the guard stopped (distinct from an error's 1,
-- so a requeue script can tell divergence, which a restart would repeat,
-- from a crash).
M.EXIT_STATUS = 3

M.OPTIONS = {
  on_nonfinite = { 'stop', 'on a NaN/inf loss or gradient norm: stop (exit 3 naming the step and parameter) or '
                   .. 'skip_step (drop the step: no update)', one_of = { 'stop', 'skip_step' } },
  max_nonfinite_skips = { 10, 'with --on_nonfinite=skip_step: stop at the non-finite step after this many skips',
                          int = true, min = 0 },
}

-- A recipe's own options plus these (its own win on a clash).
function M.options(own) return options.merge(M.OPTIONS, own) end

local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end
M.finite = finite

local function is_sharded(model) return Module.is_module(model) and rawget(model, '_fsdp') ~= nil end

-- The global gradient norm of model (collective when sharded).
local function grad_norm(model)
  if is_sharded(model) then return sharding.grad_norm(model) end
  return clip.grad_norm(model:parameters())
end

-- Scale the gradients so that their global norm `total` becomes at most
-- max_norm (PyTorch's coefficient, as fsdp.clip_grad_norm).
local function clip_to(model, max_norm, total)
  local coef = max_norm / (total + 1e-6)
  if coef >= 1 then return end
  if is_sharded(model) then sharding.scale_grads(model, coef)
  else clip.scale_grads(model:parameters(), coef) end
end

local sq = ffi.new('double[1]')

-- Sum of squares of t's elements (a C reduction in double), nil when t
-- holds none here.
local function sum_squares(t)
  if t == nil or t:numel() == 0 or not t:has_storage() then return nil end
  if not t:is_contiguous() then t = t:contiguous() end
  core.check(core.C.fl_grad_sq_norm(Tensor.cptr(t), sq))
  return sq[0]
end

-- The index (from 0) of the first NaN or infinite element of tensor t, or
-- nil when it has none: the C scan of the data on the CPU
-- (fl_first_nonfinite, what the checkpoint writer runs), elsewhere a C
-- sum of squares (then -1: there is one, its place unknown). Integer
-- tensors and tensors without storage have none.
function M.first_nonfinite_element(t)
  if t == nil or t:numel() == 0 or not t:has_storage() or not t:is_floating_point() then return nil end
  if t.device == 'cpu' then
    if not t:is_contiguous() then t = t:contiguous() end
    local c = Tensor.cptr(t)
    local i = tonumber(core.C.fl_first_nonfinite(c.data, c.numel, c.dtype))
    return i >= 0 and i or nil
  end
  local s = sum_squares(t)
  if s and not finite(s) then return -1 end
  return nil
end

-- The first parameter of model (named_parameters order) whose gradient
-- (of_values: whose value) holds a NaN or infinite element on any rank:
-- name, unit label (sharded) or nil when none does (the loss alone was
-- non-finite, or squares of huge f64 gradients overflowed). Each rank
-- looks at its part; collective when world_size > 1 (min over ranks).
function M.first_nonfinite(model, of_values)
  local params = model:named_parameters()
  local first = #params + 1
  for i, np in ipairs(params) do
    local s = sum_squares(of_values and np[2] or np[2].grad)
    if s and not finite(s) then
      first = i
      break
    end
  end
  if dist.world_size() > 1 then
    first = dist.all_reduce(factories.tensor({ first }, { dtype = 'f64' }), { op = 'min' }):item()
  end
  local np = params[first]
  if not np then return nil end
  local unit = rawget(np[2], 'fsdp_unit')
  return np[1], unit and unit:label() or nil
end

-- The test hook: poison this rank's part of the named gradients at `step`.
local function test_poison(model, step)
  local spec = os.getenv('FSDP_TEST_NONFINITE_GRAD')
  if not spec then return end
  local at, names = spec:match('^(%d+):(.+)$')
  if tonumber(at) ~= step then return end
  local wanted = {}
  for name in names:gmatch('[^,]+') do wanted[name] = true end
  for _, np in ipairs(model:named_parameters()) do
    local g = np[2].grad
    if wanted[np[1]] and g ~= nil and g:numel() > 0 and g:has_storage() then g:fill_(0 / 0) end
  end
end

local Guard = {}
Guard.__index = Guard

-- opts: model, optimizer, scheduler (optional), policy ('stop' or
-- 'skip_step'), max_skips (>= 0), grad_clip (0: no clipping),
-- say (function(line): where skip lines go; rank 0 prints by default).
function M.Guard(opts)
  local policy = opts.policy or 'stop'
  if not M.POLICIES[policy] then
    core.fail(("fsdp.nonfinite: --on_nonfinite must be stop or skip_step, got '%s'"):format(tostring(policy)))
  end
  local max_skips = opts.max_skips or 10
  if validate.problem(max_skips, validate.INDEX) then
    core.fail(('fsdp.nonfinite: --max_nonfinite_skips must be an integer >= 0, got %s'):format(tostring(max_skips)))
  end
  local grad_clip = opts.grad_clip or 0
  if validate.problem(grad_clip, validate.NONNEGATIVE) then
    core.fail(('fsdp.nonfinite: --grad_clip must be a number >= 0, got %s'):format(tostring(grad_clip)))
  end
  if not (Module.is_module(opts.model) and opts.optimizer) then
    core.fail('fsdp.nonfinite.Guard: expects {model =, optimizer =, scheduler = (optional), ...}')
  end
  return setmetatable({
    model = opts.model, optimizer = opts.optimizer, scheduler = opts.scheduler, policy = policy,
    max_skips = max_skips, grad_clip = grad_clip, skips = 0, on_stop = opts.on_stop,
    say = opts.say or function(line) console.print(line) end,
  }, Guard)
end

local function number_text(x)
  if x ~= x then return 'nan' end
  if x == math.huge then return 'inf' end
  if x == -math.huge then return '-inf' end
  return ('%.6g'):format(x)
end

-- What went wrong at `step`, in one sentence.
local function describe(step, loss, norm, name, unit)
  local where
  if name then
    where = ('first parameter with a non-finite gradient: %s%s'):format(name,
      unit and (' (unit %s)'):format(unit) or '')
  else
    where = 'no parameter\'s gradient holds a NaN or infinite element'
  end
  return ('step %d: non-finite loss or gradient norm (loss %s, gradient norm %s); %s'):format(step,
    number_text(loss), number_text(norm), where)
end

-- After loss:backward() of step `step`: check, then apply or skip the step
-- (see the top of this file). Collective on a sharded model. Returns
-- {loss = mean loss over ranks, grad_norm = the global norm before
-- clipping, lr = the lr the step used, skipped = true | nil, reduced = true
-- (the loss is already averaged: fsdp.metrics does not average it again)}.
function Guard:step(step, loss)
  local model, opt = self.model, self.optimizer
  test_poison(model, step)
  -- Sharded: the norm is global already. Unsharded in a job of several
  -- ranks (each its own model): its finiteness joins the loss's reduction.
  local norm = grad_norm(model)
  local value = type(loss) == 'number' and loss or loss:item()
  local elsewhere = false
  if dist.world_size() > 1 then
    local local_bad = (not is_sharded(model) and not finite(norm)) and 1 or 0
    local t = dist.all_reduce(factories.tensor({ value, local_bad }, { dtype = 'f64' }), { op = 'avg' })
    value, elsewhere = t:get(0), t:get(1) > 0
  end
  local lr = opt.param_groups[1].lr
  local result = { loss = value, grad_norm = norm, lr = lr, reduced = true }
  if finite(value) and finite(norm) and not elsewhere then
    if self.grad_clip > 0 then clip_to(model, self.grad_clip, norm) end
    opt:step()
    if self.scheduler then self.scheduler:step() end
    opt:zero_grad()
    return result
  end
  local name, unit = M.first_nonfinite(model)
  local text = describe(step, value, norm, name, unit)
  if self.policy == 'skip_step' and self.skips < self.max_skips then
    opt:zero_grad()
    self.skips = self.skips + 1
    self.say(('%s; step skipped: no update, gradients dropped (skip %d of at most %d, --on_nonfinite=skip_step)')
      :format(text, self.skips, self.max_skips))
    result.skipped = true
    return result
  end
  if self.policy == 'skip_step' then
    text = ('%s; stopped: %d steps were skipped already (--max_nonfinite_skips=%d)'):format(text, self.skips,
      self.max_skips)
  else
    text = text .. '; stopped before applying it (--on_nonfinite=stop)'
  end
  if self.on_stop then self.on_stop(text, step) end
  error(text, 0)
end

-- Before a checkpoint of `step` is written (fsdp.checkpointing.options's
-- after_step): the parameters are finite. A finite gradient can still
-- overflow in the update (an absurd lr); the next step's check would see
-- it, but this step's save comes first. One C pass over this rank's
-- parameter storage and one all-reduce, only on steps that save. A
-- non-finite parameter stops the run whatever the policy: the update is
-- applied and cannot be skipped.
function Guard:check_parameters(step)
  local model = self.model
  local bad = 0
  if is_sharded(model) then
    local S = rawget(model, '_fsdp')
    for _, u in ipairs(S.units) do
      local s = sum_squares(u.shard)
      if s and not finite(s) then bad = 1 end
    end
    for _, m in ipairs(S.ignored) do
      for _, p in ipairs(m:parameters()) do
        local s = sum_squares(p)
        if s and not finite(s) then bad = 1 end
      end
    end
  else
    for _, p in ipairs(model:parameters()) do
      local s = sum_squares(p)
      if s and not finite(s) then bad = 1 end
    end
  end
  if dist.world_size() > 1 then
    bad = dist.all_reduce(factories.tensor({ bad }, { dtype = 'f64' }), { op = 'max' }):item()
  end
  if bad == 0 then return end
  local name, unit = M.first_nonfinite(model, true)
  local text = ('step %d: the update made parameters non-finite (first: %s%s); stopped before saving its '
    .. 'checkpoint'):format(step, tostring(name), unit and (' (unit %s)'):format(unit) or '')
  if self.on_stop then self.on_stop(text, step) end
  error(text, 0)
end

-- The guard of a recipe: cfg.on_nonfinite, cfg.max_nonfinite_skips and
-- cfg.grad_clip (0 when the recipe has no such option) over
-- state.model/optimizer/scheduler. A stop prints one message on rank 0
-- (naming the newest checkpoint when cfg.checkpoint_dir has one) and ends
-- every rank with M.EXIT_STATUS; all ranks took the same decision, so
-- none waits for another.
function M.guard(cfg, state, script)
  local guard = M.Guard({
    model = state.model, optimizer = state.optimizer, scheduler = state.scheduler, policy = cfg.on_nonfinite,
    max_skips = cfg.max_nonfinite_skips, grad_clip = cfg.grad_clip or 0,
  })
  guard.on_stop = function(text)
    if dist.rank() == 0 then
      text = text .. checkpointing.resume_hint(cfg.checkpoint_dir)
      io.stdout:flush()
      io.stderr:write(('fsdp-lua: %s: %s\n'):format(script, text))
      io.stderr:flush()
    end
    io.stdout:flush()
    -- No rank exits before rank 0 has written: the launcher ends the job
    -- at the first rank that exits non-zero.
    if dist.world_size() > 1 then dist.barrier() end
    os.exit(M.EXIT_STATUS, true) -- closing the Lua state frees every tensor first
  end
  return guard
end

return M
