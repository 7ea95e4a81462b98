-- recipes/mnist.lua: PyTorch's MNIST getting-started example: the
-- tutorial CNN (models/mnist.lua), Adadelta with lr 1.0, StepLR gamma 0.7
-- per epoch, training loss and test accuracy per epoch.
--
--   fsdp-lua recipes/mnist.lua                        synthetic digits
--   fsdp-lua recipes/mnist.lua --data=path/to/mnist   the idx files (train-*, t10k-*)
--   fsdp-lua recipes/mnist.lua --dry-run              build on meta and print the model
--   mpirun -np 2 fsdp-lua recipes/mnist.lua           data parallel: each rank a slice of every batch
--
-- As PyTorch's FSDP MNIST tutorial, the network is one sharded unit
-- (fsdp.shard: on one rank plain training) and each rank computes the
-- loss of its slice of every batch; the loss is scaled so that the
-- averaged gradient is the whole batch's, so the losses do not depend on
-- the number of ranks (dropout's masks aside).
local fsdp = require 'fsdp'
local options = require 'fsdp.options'
local mnist_model = require 'models.mnist'
local mnist = require 'fsdp.data.mnist'
local optim = require 'fsdp.optim'
local clock = require 'fsdp.clock'
local nonfinite = require 'fsdp.nonfinite'
local accumulate = require 'fsdp.sharding.accumulate'
local F = fsdp.F

-- Each option carries its constraints, checked before anything is built.
local device = require 'fsdp.sharding.device'
local cfg = options.config(device.options(nonfinite.options(accumulate.options({
  data = { '', 'directory of the MNIST idx files (empty: synthetic digits)', input = 'dir' },
  epochs = { 3, 'training epochs', int = true, min = 1 },
  batch_size = { 64, 'training batch size (of the whole job: each rank computes a slice)', int = true, min = 1,
                 check = function(v)
                   local w = fsdp.dist.world_size()
                   if v < w then return ('(%d) must be at least the number of ranks (%d)'):format(v, w) end
                 end },
  test_batch_size = { 1000, 'evaluation batch size', int = true, min = 1 },
  lr = { 1.0, 'Adadelta learning rate', positive = true },
  gamma = { 0.7, 'StepLR decay per epoch', positive = true },
  train_size = { 6000, 'synthetic training examples', int = true, min = 1 },
  test_size = { 1000, 'synthetic test examples', int = true, min = 1 },
  max_batches = { 0, 'stop each epoch after this many batches (0: all)', int = true, min = 0 },
  seed = { 1, 'initialisation and data seed', int = true, min = 0 },
  log_interval = { 20, 'batches between log lines', int = true, min = 1 },
  dry_run = { false, 'build on meta, print the model and its parameter count, exit' },
}))), arg, 'recipes/mnist.lua')

if cfg.dry_run then
  local net = mnist_model.build({ device = 'meta' })
  print(net)
  print(('parameters: %d'):format(net:num_parameters()))
  options.expose({ model = net, cfg = cfg })  -- for the REPL after -i
  return
end

local train, test
if cfg.data ~= '' then
  train, test = mnist.load(cfg.data, 'train'), mnist.load(cfg.data, 'test')
else
  train = mnist.synthetic(cfg.train_size, { seed = cfg.seed })
  test = mnist.synthetic(cfg.test_size, { seed = cfg.seed, offset = cfg.train_size })
end
-- Under a launcher every rank runs this; rank 0 speaks ("[rank 0] " first
-- with several ranks: fsdp.console).
local W, R = fsdp.dist.world_size(), fsdp.dist.rank()
local function say(line) require('fsdp.observe.console').print(line) end
say(('data: %d training and %d test images (%s)'):format(train:size(), test:size(),
  cfg.data ~= '' and cfg.data or 'synthetic'))

fsdp.manual_seed(cfg.seed)
-- --device: the network, every batch and the loss live there (cpu or cuda:N).
local dev = device.resolve(cfg)
if dev ~= 'cpu' then say('device: ' .. device.describe(cfg)) end
-- Built on meta, then one sharded unit on the device: each rank
-- initialises its shard with the values of net:init_weights{seed}.
local net = mnist_model.build({ device = 'meta' })
fsdp.shard(net, { seed = cfg.seed, device = dev })
local opt = optim.Adadelta(net:named_parameters(), { lr = cfg.lr })
local sched = optim.lr_scheduler.StepLR(opt, 1, cfg.gamma)
-- The optimizer step and what a NaN or infinite loss or gradient does
-- (--on_nonfinite); StepLR stays per epoch, so the guard gets no scheduler.
local guard = nonfinite.guard(cfg, { model = net, optimizer = opt }, 'recipes/mnist.lua')
local step = 0

local function batches(ds, size)
  local n = math.ceil(ds:size() / size)
  if cfg.max_batches > 0 then n = math.min(n, cfg.max_batches) end
  return n
end

for epoch = 1, cfg.epochs do
  net:train()
  local t0 = clock.now()
  local nb = batches(train, cfg.batch_size)
  -- An optimizer step per --grad_accum_steps batches (fewer at the end
  -- of an epoch), gradients summed over them (fsdp.sharding.accumulate).
  local k = cfg.grad_accum_steps
  for first = 0, nb - 1, k do
    local n = math.min(k, nb - first)
    local loss = accumulate.forward_backward(net, n, function(j)
      local x, y = train:batch(first + j - 1, cfg.batch_size)
      -- This rank's rows of the batch; summed and scaled by W / rows so
      -- that the gradient averaged over ranks is the batch mean's.
      local rows = x:size(0)
      local from, to = math.floor(R * rows / W), math.floor((R + 1) * rows / W)
      x, y = x:narrow(0, from, to - from):to(dev), y:narrow(0, from, to - from):to(dev)
      return F.nll_loss(net(x), y, { reduction = 'sum' }) * (W / rows)
    end)
    step = step + 1
    local r = guard:step(step, loss)
    local i = first + n - 1
    if first % cfg.log_interval < k or i == nb - 1 or r.skipped then
      say(('Train Epoch: %d [%d/%d (%.0f%%)]\tLoss: %.6f%s'):format(epoch, i * cfg.batch_size,
        train:size(), 100 * i / nb, r.loss, r.skipped and ' (skipped: non-finite)' or ''))
    end
  end
  net:eval()
  local correct, total, loss_sum = 0, 0, 0
  fsdp.no_grad(function()
    for i = 0, batches(test, cfg.test_batch_size) - 1 do
      local x, y = test:batch(i, cfg.test_batch_size)
      x, y = x:to(dev), y:to(dev)
      local out = net(x)
      loss_sum = loss_sum + F.nll_loss(out, y, { reduction = 'sum' }):item()
      local _, pred = out:max(1)
      correct = correct + F.eq(pred, y):sum():item()
      total = total + y:size(0)
    end
  end)
  say(('Test set: Average loss: %.4f, Accuracy: %d/%d (%.1f%%), epoch time %.1f s'):format(
    loss_sum / total, correct, total, 100 * correct / total, clock.now() - t0))
  sched:step()
end
