-- nn_layers_spec.lua: the layers of fsdp.nn computing through
-- fsdp.functional, each against values worked out here element by element:
-- Linear, Embedding, RMSNorm, LayerNorm, Dropout, the activations, Conv2d,
-- MaxPool2d and Flatten; gradients reaching parameters; and a kernel's
-- error reported with the module's path. A test whose functional op is not
-- in this build is reported pending, naming the op.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'

local has_F, F = pcall(require, 'fsdp.functional')
if not has_F then F = {} end

-- it() when every named op of fsdp.functional exists, else pending().
local function it_with(ops, name, fn)
  local missing = {}
  for _, op in ipairs(ops) do
    if type(F[op]) ~= 'function' then missing[#missing + 1] = 'F.' .. op end
  end
  if #missing == 0 then it(name, fn) else pending(name .. ' (needs ' .. table.concat(missing, ', ') .. ')') end
end

local function close(a, b, tol)
  return math.abs(a - b) <= (tol or 1e-5) * (1 + math.abs(b))
end

-- Compare nested tables of numbers.
local function assert_close(got, want, tol, path)
  path = path or ''
  if type(want) == 'table' then
    assert.equals(#want, #got, 'length at ' .. path)
    for i = 1, #want do assert_close(got[i], want[i], tol, path .. '[' .. i .. ']') end
    return
  end
  assert(close(got, want, tol), ('%s: %.9g, expected %.9g'):format(path, got, want))
end

local function init(m, seed) return m:init_weights({ seed = seed or 1 }) end

describe('nn layers', function()
  it_with({ 'linear' }, 'Linear computes x W^T + b over leading dims', function()
    local l = init(nn.Linear(3, 2))
    local W, b = l.weight:tolist(), l.bias:tolist()
    local xs = { { { 1, 2, 3 }, { -1, 0.5, 0 } }, { { 0, 0, 1 }, { 2, 2, 2 } } }
    local y = l(fsdp.tensor(xs))
    assert.same({ 2, 2, 2 }, y.shape)
    local want = {}
    for i = 1, 2 do
      want[i] = {}
      for j = 1, 2 do
        want[i][j] = {}
        for o = 1, 2 do
          local s = b[o]
          for k = 1, 3 do s = s + xs[i][j][k] * W[o][k] end
          want[i][j][o] = s
        end
      end
    end
    assert_close(y:tolist(), want)
    local nb = init(nn.Linear(3, 2, { bias = false }))
    assert_close(nb(fsdp.tensor({ { 1, 0, 0 } })):tolist(), { { nb.weight:get(0, 0), nb.weight:get(1, 0) } })
  end)

  it_with({ 'embedding' }, 'Embedding looks rows up', function()
    local e = init(nn.Embedding(5, 3))
    local W = e.weight:tolist()
    local y = e(fsdp.tensor({ { 4, 0 }, { 2, 2 } }, { dtype = 'i64' }))
    assert.same({ 2, 2, 3 }, y.shape)
    assert_close(y:tolist(), { { W[5], W[1] }, { W[3], W[3] } })
  end)

  it_with({ 'rms_norm' }, 'RMSNorm divides by the root mean square and scales', function()
    local n = nn.RMSNorm(4, { eps = 1e-5 })
    init(n)
    n.weight:copy_(fsdp.tensor({ 1, 2, 0.5, -1 }))
    local x = { { 1, 2, 3, 4 }, { -2, 0, 2, 0.5 } }
    local want = {}
    for i, row in ipairs(x) do
      local ms = 0
      for _, v in ipairs(row) do ms = ms + v * v / 4 end
      local r = 1 / math.sqrt(ms + 1e-5)
      want[i] = { row[1] * r, row[2] * r * 2, row[3] * r * 0.5, -row[4] * r }
    end
    assert_close(n(fsdp.tensor(x)):tolist(), want)
  end)

  it_with({ 'layer_norm' }, 'LayerNorm normalises the last dim with weight and bias', function()
    local n = init(nn.LayerNorm(3))
    n.weight:copy_(fsdp.tensor({ 1, 2, 3 }))
    n.bias:copy_(fsdp.tensor({ 0.5, 0, -0.5 }))
    local x = { 1, 2, 6 }
    local mean = 3
    local var = ((1 - 3) ^ 2 + (2 - 3) ^ 2 + (6 - 3) ^ 2) / 3
    local r = 1 / math.sqrt(var + 1e-5)
    local want = { (1 - mean) * r * 1 + 0.5, (2 - mean) * r * 2, (6 - mean) * r * 3 - 0.5 }
    assert_close(n(fsdp.tensor({ x })):tolist(), { want })
  end)

  it_with({ 'dropout' }, 'Dropout zeroes and rescales in training and is the identity in eval', function()
    local d = nn.Dropout(0.5)
    local x = fsdp.ones({ 1000 })
    local y = d(x):tolist()
    local zeros = 0
    for _, v in ipairs(y) do
      assert(v == 0 or close(v, 2), 'dropout output ' .. v)
      if v == 0 then zeros = zeros + 1 end
    end
    assert.is_true(zeros > 400 and zeros < 600)
    d:eval()
    assert.equals(x, d(x))
    assert.equals(x, nn.Dropout(0)(x))
  end)

  it_with({ 'relu', 'gelu', 'silu' }, 'ReLU, GELU (erf and tanh) and SiLU', function()
    local xs = { -2, -0.5, 0, 0.5, 2 }
    local x = fsdp.tensor(xs)
    local relu, silu, gelu, gelu_tanh = {}, {}, {}, {}
    local function erf(v) -- its Taylor series, to double precision for |v| <= 2
      local s, term, n = 0, v, 0
      repeat
        s = s + term / (2 * n + 1)
        n = n + 1
        term = -term * v * v / n
      until math.abs(term) < 1e-17 or n > 200
      return 2 / math.sqrt(math.pi) * s
    end
    for i, v in ipairs(xs) do
      relu[i] = math.max(v, 0)
      silu[i] = v / (1 + math.exp(-v))
      gelu[i] = 0.5 * v * (1 + erf(v / math.sqrt(2)))
      gelu_tanh[i] = 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ^ 3)))
    end
    assert_close(nn.ReLU()(x):tolist(), relu)
    assert_close(nn.SiLU()(x):tolist(), silu)
    assert_close(nn.GELU()(x):tolist(), gelu)
    assert_close(nn.GELU({ approximate = 'tanh' })(x):tolist(), gelu_tanh)
  end)

  it_with({ 'conv2d' }, 'Conv2d with stride and padding', function()
    local c = init(nn.Conv2d(2, 3, 3, { stride = 2, padding = 1 }))
    local x = fsdp.randn({ 1, 2, 5, 5 }, { seed = 3 })
    local y = c(x)
    assert.same({ 1, 3, 3, 3 }, y.shape)
    local X, W, B = x:tolist()[1], c.weight:tolist(), c.bias:tolist()
    local want = {}
    for o = 1, 3 do
      want[o] = {}
      for i = 1, 3 do
        want[o][i] = {}
        for j = 1, 3 do
          local s = B[o]
          for ch = 1, 2 do
            for ki = 1, 3 do
              for kj = 1, 3 do
                local r, q = (i - 1) * 2 - 1 + ki, (j - 1) * 2 - 1 + kj
                if r >= 1 and r <= 5 and q >= 1 and q <= 5 then s = s + X[ch][r][q] * W[o][ch][ki][kj] end
              end
            end
          end
          want[o][i][j] = s
        end
      end
    end
    assert_close(y:tolist()[1], want, 1e-4)
  end)

  it_with({ 'max_pool2d' }, 'MaxPool2d and Flatten', function()
    local x = fsdp.arange(16, { dtype = 'f32' }):view(1, 1, 4, 4)
    local y = nn.MaxPool2d(2)(x)
    assert.same({ { { { 5, 7 }, { 13, 15 } } } }, y:tolist())
    assert.same({ 1, 4 }, nn.Flatten()(y).shape)
  end)

  it_with({ 'linear', 'relu' }, 'Sequential runs layers in order on meta too', function()
    local s = nn.Sequential(nn.Linear(8, 16, { device = 'meta' }), nn.ReLU(), nn.Linear(16, 4, { device = 'meta' }))
    local y = s(fsdp.empty({ 2, 8 }, { device = 'meta' }))
    assert.same({ 2, 4 }, y.shape)
    assert.is_true(y:is_meta())
  end)

  it_with({ 'linear' }, 'reports a kernel error with the module path', function()
    local Net = nn.Module:extend('Net')
    function Net:__init() self.body = nn.Sequential(nn.Linear(4, 4), nn.Linear(5, 2)) end
    function Net:forward(x) return self.body(x) end
    local net = init(Net())
    local ok, err = pcall(net, fsdp.zeros({ 1, 4 }))
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find('^in body%.1: '), err)
  end)

  it_with({ 'linear' }, 'gradients reach the parameters', function()
    local l = init(nn.Linear(3, 2))
    local y = l(fsdp.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }))
    local loss = y:sum()
    loss:backward()
    assert_close(l.weight.grad:tolist(), { { 5, 7, 9 }, { 5, 7, 9 } })
    assert_close(l.bias.grad:tolist(), { 2, 2 })
  end)
end)
