-- fsdp.optim.lr_scheduler: learning-rate schedules that set the lr of each
-- parameter group of an optimizer, as torch.optim.lr_scheduler.
--
--   local sched = lr_scheduler.WarmupDecay(opt, {warmup_steps = 100,
--     total_steps = 10000, decay = 'cosine', min_lr_ratio = 0.1})
--   for step = 1, n do ...; opt:step(); sched:step() end
--   local sched = lr_scheduler.StepLR(opt, 1, 0.7)   -- per epoch (MNIST)
--
-- Each group's base lr is its lr when the first scheduler is attached
-- (kept as group.initial_lr, as PyTorch). Creating a scheduler applies the
-- lr of step 0; step() advances one step and applies its lr; get_lr()
-- returns the lrs in effect; lr_at(t) the lrs of step t, without side
-- effects.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'

local M = {}

local Scheduler = {}
Scheduler.__index = Scheduler
M.Scheduler = Scheduler

-- A schedule class whose lr_factor(self, t, base) gives the lr of a group
-- with base lr `base` at step t.
function Scheduler:extend(name)
  local cls = setmetatable({}, {
    __index = self,
    __call = function(c, ...) return c.new(c, ...) end,
  })
  cls.__index = cls
  cls.name = name
  return cls
end

function Scheduler.attach(self, optimizer)
  if type(optimizer) ~= 'table' or type(optimizer.param_groups) ~= 'table' then
    core.fail(self.name .. ': expects an optimizer as its first argument')
  end
  self.optimizer = optimizer
  self.last_step = 0
  for _, g in ipairs(optimizer.param_groups) do
    if g.initial_lr == nil then g.initial_lr = g.lr end
  end
  self:apply()
  return self
end

function Scheduler:lr_at(t)
  local out = {}
  for i, g in ipairs(self.optimizer.param_groups) do out[i] = self:lr_of(t, g.initial_lr) end
  return out
end

function Scheduler:apply()
  local lrs = self:lr_at(self.last_step)
  for i, g in ipairs(self.optimizer.param_groups) do g.lr = lrs[i] end
end

function Scheduler:step()
  self.last_step = self.last_step + 1
  self:apply()
end

function Scheduler:get_lr()
  local out = {}
  for i, g in ipairs(self.optimizer.param_groups) do out[i] = g.lr end
  return out
end

function Scheduler:state_dict()
  return { last_step = self.last_step }
end

function Scheduler:load_state_dict(sd)
  self.last_step = sd.last_step
  self:apply()
end

-- WarmupDecay ----------------------------------------------------------------------

-- Linear warmup, then a decay to a minimum at total_steps, held after:
--   t < warmup:        base * (t + 1) / (warmup + 1)    (nanoGPT, torchtitan)
--   warmup <= t:       p = (t - warmup) / (total - warmup), clamped to [0, 1]
--     'cosine':        min + (base - min) * (1 + cos(pi * p)) / 2
--     'linear':        min + (base - min) * (1 - p)
--     'constant':      base
-- opts: warmup_steps (0), total_steps (needed for cosine and linear),
-- decay ('cosine'), and min_lr (absolute) or min_lr_ratio (of each
-- group's base lr; 0 by default).
local WarmupDecay = Scheduler:extend('WarmupDecay')
M.WarmupDecay = WarmupDecay

local DECAYS = { cosine = true, linear = true, constant = true }

function WarmupDecay.new(cls, optimizer, opts)
  local self = setmetatable({}, cls)
  opts = opts or {}
  self.warmup_steps = opts.warmup_steps or 0
  self.total_steps = opts.total_steps
  self.decay = opts.decay or 'cosine'
  self.min_lr, self.min_lr_ratio = opts.min_lr, opts.min_lr_ratio or 0
  if not DECAYS[self.decay] then
    core.fail(("WarmupDecay: decay must be 'cosine', 'linear' or 'constant', got %s"):format(tostring(self.decay)))
  end
  local why = validate.problem(self.warmup_steps, validate.NONNEGATIVE)
  if why then core.fail('WarmupDecay: warmup_steps ' .. why) end
  if self.decay ~= 'constant' then
    if validate.problem(self.total_steps) or not (self.total_steps > self.warmup_steps) then
      core.fail(('WarmupDecay: %s decay needs total_steps > warmup_steps (%d), got %s')
        :format(self.decay, self.warmup_steps, tostring(self.total_steps)))
    end
  end
  if self.min_lr ~= nil and opts.min_lr_ratio ~= nil then
    core.fail('WarmupDecay: give min_lr or min_lr_ratio, not both')
  end
  return Scheduler.attach(self, optimizer)
end

function WarmupDecay:lr_of(t, base)
  local w = self.warmup_steps
  if t < w then return base * (t + 1) / (w + 1) end
  if self.decay == 'constant' then return base end
  local min = self.min_lr or base * self.min_lr_ratio
  local p = math.min(1, math.max(0, (t - w) / (self.total_steps - w)))
  if self.decay == 'linear' then return min + (base - min) * (1 - p) end
  return min + (base - min) * 0.5 * (1 + math.cos(math.pi * p))
end

-- Shorthands for the three decays.
function M.WarmupCosine(optimizer, opts)
  return WarmupDecay(optimizer, { warmup_steps = opts.warmup_steps, total_steps = opts.total_steps,
    decay = 'cosine', min_lr = opts.min_lr, min_lr_ratio = opts.min_lr_ratio })
end

function M.WarmupLinear(optimizer, opts)
  return WarmupDecay(optimizer, { warmup_steps = opts.warmup_steps, total_steps = opts.total_steps,
    decay = 'linear', min_lr = opts.min_lr, min_lr_ratio = opts.min_lr_ratio })
end

function M.WarmupConstant(optimizer, opts)
  return WarmupDecay(optimizer, { warmup_steps = opts.warmup_steps, decay = 'constant' })
end

-- StepLR -------------------------------------------------------------------------------

-- base * gamma ^ floor(t / step_size), as torch.optim.lr_scheduler.StepLR:
-- StepLR(opt, step_size, gamma) or StepLR(opt, {step_size =, gamma = 0.1}).
local StepLR = Scheduler:extend('StepLR')
M.StepLR = StepLR

function StepLR.new(cls, optimizer, step_size, gamma)
  local self = setmetatable({}, cls)
  if type(step_size) == 'table' then step_size, gamma = step_size.step_size, step_size.gamma end
  if validate.problem(step_size, validate.COUNT) then
    core.fail(('StepLR: step_size must be a positive integer, got %s'):format(validate.show(step_size)))
  end
  self.step_size, self.gamma = step_size, gamma or 0.1
  return Scheduler.attach(self, optimizer)
end

function StepLR:lr_of(t, base)
  return base * self.gamma ^ math.floor(t / self.step_size)
end

-- LambdaLR -------------------------------------------------------------------------------

-- base * fn(t), as torch.optim.lr_scheduler.LambdaLR.
local LambdaLR = Scheduler:extend('LambdaLR')
M.LambdaLR = LambdaLR

function LambdaLR.new(cls, optimizer, fn)
  local self = setmetatable({}, cls)
  if type(fn) ~= 'function' then core.fail('LambdaLR: expects a function of the step') end
  self.fn = fn
  return Scheduler.attach(self, optimizer)
end

function LambdaLR:lr_of(t, base)
  return base * self.fn(t)
end

return M
