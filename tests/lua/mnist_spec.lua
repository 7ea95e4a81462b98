-- mnist_spec.lua: the tutorial CNN (exact parameter count), the idx file
-- reader (values, bad magic, truncation), and the recipe's promise: on
-- separable synthetic digits the CNN passes 95% test accuracy.
local fsdp = require 'fsdp'
local mnist_model = require 'models.mnist'
local mnist = require 'fsdp.data.mnist'
local optim = require 'fsdp.optim'
local F = fsdp.F

local function u32be(n)
  return string.char(math.floor(n / 2^24) % 256, math.floor(n / 2^16) % 256, math.floor(n / 2^8) % 256, n % 256)
end

local function write(path, s)
  local f = assert(io.open(path, 'wb'))
  f:write(s)
  f:close()
end

describe('MNIST', function()
  it('has the tutorial CNN with 1,199,882 parameters', function()
    local net = mnist_model.build({ device = 'meta' })
    assert.equals(1199882, net:num_parameters())
    local x = fsdp.empty({ 7, 1, 28, 28 }, { device = 'meta' })
    assert.same({ 7, 10 }, net(x).shape)
  end)

  it('reads idx files and names broken ones', function()
    local dir = os.tmpname()
    os.remove(dir)
    os.execute('mkdir -p ' .. dir)
    local pixels = {}
    for i = 0, 2 * 4 - 1 do pixels[#pixels + 1] = string.char(i * 30) end
    write(dir .. '/train-images-idx3-ubyte', u32be(2051) .. u32be(2) .. u32be(2) .. u32be(2) .. table.concat(pixels))
    write(dir .. '/train-labels-idx1-ubyte', u32be(2049) .. u32be(2) .. '\7\3')
    local ds = mnist.load(dir, 'train')
    assert.equals(2, ds:size())
    local x, y = ds:batch(0, 2)
    assert.same({ 7, 3 }, y:tolist())
    assert.is_true(math.abs(x:get(1, 0, 1, 1) - (210 / 255 - 0.1307) / 0.3081) < 1e-5)
    write(dir .. '/t10k-images-idx3-ubyte', u32be(2049) .. u32be(1))
    write(dir .. '/t10k-labels-idx1-ubyte', u32be(2049) .. u32be(1) .. '\1')
    assert.error_matches(function() mnist.load(dir, 'test') end, 'not an idx3 image file')
    write(dir .. '/t10k-images-idx3-ubyte', u32be(2051) .. u32be(1) .. u32be(28) .. u32be(28) .. 'xx')
    assert.error_matches(function() mnist.load(dir, 'test') end, 'truncated: 2 bytes of data for 784 expected')
    assert.error_matches(function() mnist.load(dir .. '/missing', 'train') end, 'cannot open')
  end)

  it('trains the tutorial CNN past 95% test accuracy on synthetic digits', function()
    local train = mnist.synthetic(3000, { seed = 1 })
    local test = mnist.synthetic(500, { seed = 1, offset = 3000 })
    fsdp.manual_seed(1)
    local net = mnist_model.build()
    net:init_weights({ seed = 1 })
    local opt = optim.Adadelta(net:named_parameters(), { lr = 1.0 })
    for i = 0, math.ceil(3000 / 64) - 1 do
      local x, y = train:batch(i, 64)
      local loss = F.nll_loss(net(x), y)
      loss:backward()
      opt:step()
      opt:zero_grad()
    end
    net:eval()
    local x, y = test:batch(0, 500)
    local _, pred = fsdp.no_grad(function() return net(x) end):max(1)
    local accuracy = F.eq(pred, y):sum():item() / 500
    assert.is_true(accuracy > 0.95, ('accuracy %.3f'):format(accuracy))
  end)
end)
