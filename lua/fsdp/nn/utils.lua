-- fsdp.nn.utils: helpers over a model's parameters, as torch.nn.utils.
--
--   nn.utils.clip_grad_norm_(model:parameters(), 1.0)  -> total norm
--
-- (Implemented in fsdp.optim.clip, next to the optimizers that consume the
-- clipped gradients; re-exported here under PyTorch's name.)
local clip = require 'fsdp.optim.clip'

local M = {}

M.clip_grad_norm_ = clip.clip_grad_norm_
M.grad_norm = clip.grad_norm

return M
