-- fsdp.optim: optimizers with fused C updates, learning-rate schedules and
-- gradient clipping.
--
--   local optim = require 'fsdp.optim'
--   local opt = optim.AdamW(model:named_parameters(), {lr = 3e-4, weight_decay = 0.1})
--   local sched = optim.lr_scheduler.WarmupDecay(opt, {warmup_steps = 100, total_steps = 1000})
--   optim.clip_grad_norm_(model:parameters(), 1.0); opt:step(); sched:step(); opt:zero_grad()
local clip = require 'fsdp.optim.clip'

local M = {}

M.Optimizer = require 'fsdp.optim.optimizer'
M.AdamW = require 'fsdp.optim.adamw'
M.AnyPrecisionAdamW = require 'fsdp.optim.anyprecision_adamw'
M.SGD = require 'fsdp.optim.sgd'
M.Adadelta = require 'fsdp.optim.adadelta'
M.lr_scheduler = require 'fsdp.optim.lr_scheduler'
M.clip = clip
M.clip_grad_norm_ = clip.clip_grad_norm_

return M
