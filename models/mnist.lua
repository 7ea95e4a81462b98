-- models/mnist.lua: the CNN of PyTorch's MNIST getting-started example
-- (MODELS.md): conv1 Conv2d(1, 32, 3, 1) -> ReLU -> conv2 Conv2d(32, 64, 3,
-- 1) -> ReLU -> max_pool 2 -> dropout 0.25 -> flatten (9216) -> fc1
-- Linear(9216, 128) -> ReLU -> dropout 0.5 -> fc2 Linear(128, 10) ->
-- log_softmax. 1,199,882 parameters.
--
--   local mnist = require 'models.mnist'
--   local net = mnist.build()              -- {device=, dtype=}
--   local log_probs = net(images)          -- images f32 [N, 1, 28, 28]
local nn = require 'fsdp.nn'
local F = require 'fsdp.functional'
local suggest = require 'fsdp.suggest'

local M = {}

local Net = nn.Module:extend('Net')
M.Net = Net

function Net:__init(opts)
  opts = opts or {}
  local o = { device = opts.device, dtype = opts.dtype }
  self.conv1 = nn.Conv2d(1, 32, 3, { stride = 1, device = o.device, dtype = o.dtype })
  self.conv2 = nn.Conv2d(32, 64, 3, { stride = 1, device = o.device, dtype = o.dtype })
  self.dropout1 = nn.Dropout(0.25)
  self.dropout2 = nn.Dropout(0.5)
  self.fc1 = nn.Linear(9216, 128, o)
  self.fc2 = nn.Linear(128, 10, o)
end

function Net:forward(x)
  x = F.relu(self.conv1(x))
  x = F.relu(self.conv2(x))
  x = F.max_pool2d(x, 2, 2)
  x = self.dropout1(x)
  x = x:flatten(1)
  x = F.relu(self.fc1(x))
  x = self.dropout2(x)
  return F.log_softmax(self.fc2(x), 1)
end

-- opts: device, dtype; the network has no config, so any other key is a
-- mistake (named, with "did you mean ...?").
function M.build(opts)
  if opts ~= nil and type(opts) ~= 'table' then error(('mnist.build: expected an options table, got %s'):format(type(opts)), 2) end
  for k in pairs(opts or {}) do
    if k ~= 'device' and k ~= 'dtype' then
      error(("mnist.build: unknown option '%s'%s (options: device, dtype)"):format(tostring(k),
        suggest.hint(k, { 'device', 'dtype' })), 2)
    end
  end
  return Net(opts)
end

return M
