-- nn_spec.lua: the module framework of fsdp.nn, independent of the kernels
-- behind the layers: classes and calling, the module tree and its fully
-- qualified names, shared (tied) parameters, parameter counts of real
-- models built on meta (allocating nothing), PyTorch-identical printing,
-- deferred init keyed by (seed, name, index) including shards generated
-- alone, conversion, hooks, state dicts, and errors that name the module.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local repr = require 'fsdp.nn.repr'

local function error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, 'expected an error')
  return tostring(err)
end

local function assert_mentions(err, fragment)
  assert(err:find(fragment, 1, true), ('error %q does not mention %q'):format(err, fragment))
end

local function names_of(pairs_list)
  local out = {}
  for i, e in ipairs(pairs_list) do out[i] = e[1] end
  return out
end

-- Modules written in Lua only (no kernels): a scale and an add.
local Scale = nn.Module:extend('Scale')
function Scale:__init(k) self.k = k end
function Scale:forward(x) return x * self.k end

local Fail = nn.Module:extend('Fail')
function Fail:forward() error('boom') end

-- A Llama-shaped tree built from nn layers (no forward needed here).
local function llama_like(c, opts)
  local Attn = nn.Module:extend('LlamaAttention')
  function Attn:__init()
    local hd = c.dim / c.heads
    self.q_proj = nn.Linear(c.dim, c.heads * hd, { bias = false, device = opts.device })
    self.k_proj = nn.Linear(c.dim, c.kv * hd, { bias = false, device = opts.device })
    self.v_proj = nn.Linear(c.dim, c.kv * hd, { bias = false, device = opts.device })
    self.o_proj = nn.Linear(c.heads * hd, c.dim, { bias = false, device = opts.device })
  end
  local MLP = nn.Module:extend('LlamaMLP')
  function MLP:__init()
    self.gate_proj = nn.Linear(c.dim, c.ffn, { bias = false, device = opts.device })
    self.up_proj = nn.Linear(c.dim, c.ffn, { bias = false, device = opts.device })
    self.down_proj = nn.Linear(c.ffn, c.dim, { bias = false, device = opts.device })
  end
  local Layer = nn.Module:extend('LlamaDecoderLayer')
  function Layer:__init()
    self.self_attn = Attn()
    self.mlp = MLP()
    self.input_layernorm = nn.RMSNorm(c.dim, { eps = 1e-5, device = opts.device })
    self.post_attention_layernorm = nn.RMSNorm(c.dim, { eps = 1e-5, device = opts.device })
  end
  local Model = nn.Module:extend('LlamaModel')
  function Model:__init()
    self.embed_tokens = nn.Embedding(c.vocab, c.dim, { device = opts.device })
    self.layers = nn.ModuleList()
    for _ = 1, c.layers do self.layers:append(Layer()) end
    self.norm = nn.RMSNorm(c.dim, { eps = 1e-5, device = opts.device })
  end
  local LM = nn.Module:extend('LlamaForCausalLM')
  function LM:__init()
    self.model = Model()
    self.lm_head = nn.Linear(c.dim, c.vocab, { bias = false, device = opts.device })
    if c.tied then self.lm_head.weight = self.model.embed_tokens.weight end
  end
  return LM()
end

describe('nn.Module classes', function()
  it('derive classes, construct instances and call forward through __call', function()
    local m = Scale(3)
    assert.is_true(nn.is_module(m))
    assert.is_false(nn.is_module(Scale))
    assert.equals('Scale', m:class_name())
    assert.equals(6, m(2))
    assert.is_true(m:is_instance_of(Scale))
    assert.is_true(m:is_instance_of(nn.Module))
    assert.is_false(m:is_instance_of(nn.Linear))
    assert.equals('class Scale', tostring(Scale))
  end)

  it('inherit __init and methods; a subclass reaches its parent as Parent.__init', function()
    local Twice = Scale:extend('Twice')
    function Twice:__init(k) Scale.__init(self, 2 * k) end
    local t = Twice(5)
    assert.equals(20, t(2))
    assert.is_true(t:is_instance_of(Scale))
    local Wide = nn.Linear:extend('Wide')
    local w = Wide(3, 4, { device = 'meta' })
    assert.same({ 4, 3 }, w.weight.shape)
    assert.equals('Wide(in_features=3, out_features=4, bias=True)', tostring(w))
  end)

  it('refuse child names that are not names or collide with methods', function()
    local m = nn.Module()
    assert_mentions(error_of(m.add_module, m, 'forward', Scale(1)), "add_module: name 'forward' collides with a method")
    assert_mentions(error_of(m.add_module, m, 'a.b', Scale(1)), 'must be non-empty and contain no "."')
    assert_mentions(error_of(m.add_module, m, 'x', 42), "add_module: 'x' is a number, not a Module")
    assert_mentions(error_of(m.register_parameter, m, 'p', {}), "register_parameter: 'p' is a table, not a Tensor")
  end)
end)

describe('the module tree', function()
  local function tree()
    local Net = nn.Module:extend('Net')
    function Net:__init()
      self.embed = nn.Embedding(10, 4, { device = 'meta' })
      self.blocks = nn.ModuleList({ nn.Linear(4, 4, { device = 'meta' }), nn.Linear(4, 4, { bias = false, device = 'meta' }) })
      self.head = nn.Sequential({ { 'norm', nn.LayerNorm(4, { device = 'meta' }) }, { 'act', nn.GELU() } })
      self:register_buffer('steps', fsdp.zeros({ 1 }, { device = 'meta' }))
      self:register_buffer('cache', fsdp.zeros({ 2 }, { device = 'meta' }), { persistent = false })
    end
    return Net()
  end

  it('names parameters, modules, children and buffers in registration order', function()
    local m = tree()
    assert.same({ 'embed.weight', 'blocks.0.weight', 'blocks.0.bias', 'blocks.1.weight',
                  'head.norm.weight', 'head.norm.bias' }, names_of(m:named_parameters()))
    assert.same({ '', 'embed', 'blocks', 'blocks.0', 'blocks.1', 'head', 'head.norm', 'head.act' },
                names_of(m:named_modules()))
    assert.same({ 'embed', 'blocks', 'head' }, names_of(m:named_children()))
    assert.same({ 'steps', 'cache' }, names_of(m:named_buffers()))
    assert.equals(6, #m:parameters())
    assert.equals(8, #m:modules())
    assert.equals(m.blocks[2], m:named_modules()[5][2])
    assert.equals('blocks.1', m.blocks[2]:path())
    assert.equals('', m:path())
    assert.equals(10 * 4 + 4 * 4 + 4 + 4 * 4 + 4 + 4, m:num_parameters())
  end)

  it('makes parameters that require grad and carry their init rule', function()
    local m = tree()
    local w = m.blocks[1].weight
    assert.is_true(w.is_param)
    assert.is_true(w.requires_grad)
    assert.same(nn.init.kaiming_uniform(4), w.init)
    assert.same(nn.init.normal(1), m.embed.weight.init)
    assert.same(nn.init.zeros(), m.head.norm.bias.init)
  end)

  it('lists a tied tensor once, under its first name, and counts it once', function()
    local m = llama_like({ dim = 8, heads = 2, kv = 1, ffn = 16, vocab = 32, layers = 2, tied = true },
                         { device = 'meta' })
    local names = names_of(m:named_parameters())
    assert.equals('model.embed_tokens.weight', names[1])
    for _, n in ipairs(names) do assert.are_not.equal('lm_head.weight', n) end
    local all = names_of(m:named_parameters({ remove_duplicate = false }))
    assert.equals('lm_head.weight', all[#all])
    assert.equals(#names + 1, #all)
    assert.equals(m.lm_head.weight, m.model.embed_tokens.weight)
    local sd, keys = m:state_dict()
    assert.equals(sd['lm_head.weight'], sd['model.embed_tokens.weight'])
    assert.equals(#all, #keys)
    -- per layer: q 8x8, k 8x4, v 8x4, o 8x8, 3 MLP 8x16, two norms of 8
    local per_layer = 64 + 32 + 32 + 64 + 3 * 128 + 16
    assert.equals(2 * per_layer + 8 + 32 * 8, m:num_parameters())
  end)

  it('switches training mode recursively and applies functions children first', function()
    local m = tree()
    assert.is_true(m.head.act.training)
    assert.equals(m, m:eval())
    for _, mod in ipairs(m:modules()) do assert.is_false(mod.training) end
    m:train()
    assert.is_true(m.blocks[1].training)
    local order = {}
    m.head:apply(function(x) order[#order + 1] = x:class_name() end)
    assert.same({ 'LayerNorm', 'GELU', 'Sequential' }, order)
  end)

  it('removes children and parameters assigned nil', function()
    local m = tree()
    m.head = nil
    assert.same({ 'embed', 'blocks' }, names_of(m:named_children()))
    assert.is_nil(m.head)
    m.blocks[1].bias = nil
    assert.same({ 'embed.weight', 'blocks.0.weight', 'blocks.1.weight' }, names_of(m:named_parameters()))
  end)
end)

describe('containers', function()
  it('ModuleList supports #, ipairs, append and extend with PyTorch names', function()
    local l = nn.ModuleList({ Scale(1), Scale(2) })
    l:append(Scale(3)):extend({ Scale(4) })
    assert.equals(4, #l)
    local ks = {}
    for i, m in ipairs(l) do ks[i] = m.k end
    assert.same({ 1, 2, 3, 4 }, ks)
    assert.same({ '0', '1', '2', '3' }, names_of(l:named_children()))
    assert_mentions(error_of(l.append, l, 'x'), 'ModuleList:append: element 5 is a string, not a Module')
    assert_mentions(error_of(function() return l(1) end), 'ModuleList has no forward()')
    local MyList = nn.ModuleList:extend('MyList')
    assert.equals('MyList', MyList():class_name())
  end)

  it('Sequential chains its children', function()
    local s = nn.Sequential(Scale(2), Scale(3), Scale(5))
    assert.equals(30, s(1))
    assert.equals(3, #s)
    local named = nn.Sequential({ { 'a', Scale(2) }, { 'b', Scale(7) } })
    assert.equals(14, named(1))
    assert.same({ 'a', 'b' }, names_of(named:named_children()))
  end)

  it('ModuleDict keeps insertion order (sorted keys for a plain map)', function()
    local d = nn.ModuleDict({ { 'z', Scale(1) }, { 'a', Scale(2) } })
    assert.same({ 'z', 'a' }, d:keys())
    assert.equals(2, d.a.k)
    assert.equals(1, d:get('z').k)
    local seen = {}
    for name, m in d:items() do seen[#seen + 1] = name .. m.k end
    assert.same({ 'z1', 'a2' }, seen)
    assert.same({ 'a', 'b' }, nn.ModuleDict({ b = Scale(1), a = Scale(2) }):keys())
  end)
end)

describe('models built on meta', function()
  it('allocate nothing and count Llama-2-7b and Llama-3.2-1B exactly', function()
    fsdp.reset_memory_stats('cpu')
    local before = fsdp.memory_stats('cpu')
    local m7 = llama_like({ dim = 4096, heads = 32, kv = 32, ffn = 11008, vocab = 32000, layers = 32 },
                          { device = 'meta' })
    assert.equals(6738415616, m7:num_parameters())
    local m1 = llama_like({ dim = 2048, heads = 32, kv = 8, ffn = 8192, vocab = 128256, layers = 16, tied = true },
                          { device = 'meta' })
    assert.equals(1235814400, m1:num_parameters())
    m7:init_weights({ seed = 3 })
    local after = fsdp.memory_stats('cpu')
    assert.equals(before.allocations, after.allocations)
    assert.equals(before.peak, after.peak) -- (in_use may drop: the collector frees older tensors)
    assert.is_true(m7.model.layers[32].mlp.down_proj.weight:is_meta())
  end)

  it('count the MNIST CNN as the tutorial does', function()
    local Net = nn.Module:extend('Net')
    function Net:__init()
      self.conv1 = nn.Conv2d(1, 32, 3, { stride = 1, device = 'meta' })
      self.conv2 = nn.Conv2d(32, 64, 3, { stride = 1, device = 'meta' })
      self.dropout1 = nn.Dropout(0.25)
      self.dropout2 = nn.Dropout(0.5)
      self.fc1 = nn.Linear(9216, 128, { device = 'meta' })
      self.fc2 = nn.Linear(128, 10, { device = 'meta' })
    end
    local net = Net()
    assert.equals(1199882, net:num_parameters())
    assert.equals([[
Net(
  (conv1): Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1))
  (conv2): Conv2d(32, 64, kernel_size=(3, 3), stride=(1, 1))
  (dropout1): Dropout(p=0.25, inplace=False)
  (dropout2): Dropout(p=0.5, inplace=False)
  (fc1): Linear(in_features=9216, out_features=128, bias=True)
  (fc2): Linear(in_features=128, out_features=10, bias=True)
)]], tostring(net))
  end)
end)

describe('printing', function()
  it('matches PyTorch, collapsing identical ModuleList entries', function()
    local m = llama_like({ dim = 4096, heads = 32, kv = 32, ffn = 11008, vocab = 32000, layers = 32 },
                         { device = 'meta' })
    assert.equals([[
LlamaForCausalLM(
  (model): LlamaModel(
    (embed_tokens): Embedding(32000, 4096)
    (layers): ModuleList(
      (0-31): 32 x LlamaDecoderLayer(
        (self_attn): LlamaAttention(
          (q_proj): Linear(in_features=4096, out_features=4096, bias=False)
          (k_proj): Linear(in_features=4096, out_features=4096, bias=False)
          (v_proj): Linear(in_features=4096, out_features=4096, bias=False)
          (o_proj): Linear(in_features=4096, out_features=4096, bias=False)
        )
        (mlp): LlamaMLP(
          (gate_proj): Linear(in_features=4096, out_features=11008, bias=False)
          (up_proj): Linear(in_features=4096, out_features=11008, bias=False)
          (down_proj): Linear(in_features=11008, out_features=4096, bias=False)
        )
        (input_layernorm): RMSNorm((4096,), eps=1e-05, elementwise_affine=True)
        (post_attention_layernorm): RMSNorm((4096,), eps=1e-05, elementwise_affine=True)
      )
    )
    (norm): RMSNorm((4096,), eps=1e-05, elementwise_affine=True)
  )
  (lm_head): Linear(in_features=4096, out_features=32000, bias=False)
)]], tostring(m))
  end)

  it('lists runs separately and prints leaves and containers as PyTorch', function()
    local l = nn.ModuleList({ nn.ReLU(), nn.ReLU(), nn.SiLU(), nn.ReLU(), nn.GELU({ approximate = 'tanh' }) })
    assert.equals([[
ModuleList(
  (0-1): 2 x ReLU()
  (2): SiLU()
  (3): ReLU()
  (4): GELU(approximate='tanh')
)]], tostring(l))
    assert.equals('ModuleList()', tostring(nn.ModuleList()))
    assert.equals('Module()', tostring(nn.Module()))
    assert.equals([[
Sequential(
  (0): Flatten(start_dim=1, end_dim=-1)
  (1): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)
  (2): LayerNorm((8,), eps=1e-06, elementwise_affine=True)
  (3): Conv2d(3, 8, kernel_size=(5, 3), stride=(2, 2), padding=(1, 1), bias=False)
)]], tostring(nn.Sequential(nn.Flatten(), nn.MaxPool2d(2), nn.LayerNorm(8, { eps = 1e-6, device = 'meta' }),
      nn.Conv2d(3, 8, { 5, 3 }, { stride = 2, padding = 1, bias = false, device = 'meta' }))))
    assert.equals('GELU(approximate=\'none\')', tostring(nn.GELU()))
  end)

  it('formats floats as Python repr does', function()
    local cases = {
      { 1e-5, '1e-05' }, { 1e-6, '1e-06' }, { 0.1, '0.1' }, { 0.5, '0.5' }, { 4096, '4096.0' },
      { 1e16, '1e+16' }, { 1e-4, '0.0001' }, { 1.5e-7, '1.5e-07' }, { 123456789, '123456789.0' },
      { -0.25, '-0.25' }, { 0, '0.0' }, { 1 / 3, '0.3333333333333333' }, { 2.5e20, '2.5e+20' },
      { 1234.5678, '1234.5678' }, { 1e15, '1000000000000000.0' },
    }
    for _, c in ipairs(cases) do assert.equals(c[2], repr.float(c[1])) end
    assert.equals('(4096,)', repr.tuple({ 4096 }))
    assert.equals('(3, 3)', repr.tuple({ 3, 3 }))
  end)
end)

describe('deferred init', function()
  local function small(opts)
    local Net = nn.Module:extend('Small')
    function Net:__init()
      self.a = nn.Linear(5, 7, { device = opts.device })
      self.b = nn.Linear(5, 7, { device = opts.device })
      self.e = nn.Embedding(11, 3, { device = opts.device, init = nn.init.normal(0.02, 1) })
      self.n = nn.LayerNorm(7, { device = opts.device })
      self.u = nn.Linear(3, 2, { device = opts.device, init = nn.init.uniform(-3, -2) })
    end
    return Net()
  end

  it('pins FNV-1a-64 of names (the stream contract)', function()
    assert.equals(0xcbf29ce484222325ULL, nn.init_stream(''))
    assert.equals(0xaf63dc4c8601ec8cULL, nn.init_stream('a'))
    assert.equals(0x85944171f73967e8ULL, nn.init_stream('foobar'))
  end)

  it('keys values by (seed, name, index): same seed, same values; names differ', function()
    local m1 = small({}):init_weights({ seed = 7 })
    local m2 = small({}):init_weights({ seed = 7 })
    local m3 = small({}):init_weights({ seed = 8 })
    assert.same(m1.a.weight:tolist(), m2.a.weight:tolist())
    assert.same(m1.e.weight:tolist(), m2.e.weight:tolist())
    assert.are_not.same(m1.a.weight:tolist(), m3.a.weight:tolist())
    assert.are_not.same(m1.a.weight:tolist(), m1.b.weight:tolist()) -- same shape and rule, other name
    -- the value is the generator's at (seed, fnv(name), index): the contract
    local direct = fsdp.rand({ 7, 5 }, { seed = 7, stream = nn.init_stream('a.weight'),
                                        low = -1 / math.sqrt(5), high = 1 / math.sqrt(5) })
    assert.same(direct:tolist(), m1.a.weight:tolist())
    local e = fsdp.randn({ 11, 3 }, { seed = 7, stream = nn.init_stream('e.weight'), mean = 1, std = 0.02 })
    assert.same(e:tolist(), m1.e.weight:tolist())
    assert.same({ 1, 1, 1, 1, 1, 1, 1 }, m1.n.weight:tolist())
    assert.same({ 0, 0, 0, 0, 0, 0, 0 }, m1.n.bias:tolist())
    for _, row in ipairs(m1.u.weight:tolist()) do
      for _, v in ipairs(row) do assert.is_true(v >= -3 and v < -2) end
    end
    local bound = 1 / math.sqrt(5)
    for _, v in ipairs(m1.a.bias:tolist()) do assert.is_true(v >= -bound and v <= bound) end
  end)

  it('fills a shard alone with the values of the whole (offset = first element)', function()
    local m = small({}):init_weights({ seed = 42 })
    for _, np in ipairs(m:named_parameters()) do
      local name, p = np[1], np[2]
      local flat = p:reshape(p:numel())
      local n = p:numel()
      -- three uneven shards, as ranks of a padded flat parameter would hold
      local cuts = { 0, math.floor(n / 3), math.floor(n / 3) + 1, n }
      for i = 1, #cuts - 1 do
        local len = cuts[i + 1] - cuts[i]
        if len > 0 then
          local part = fsdp.empty({ len })
          nn.init_fill(part, p.init, { seed = 42, name = name, offset = cuts[i] })
          assert.same(flat:narrow(0, cuts[i], len):tolist(), part:tolist())
        end
      end
    end
  end)

  it('materialises a meta model on cpu with the values of a cpu-built one', function()
    local meta = small({ device = 'meta' })
    assert.is_true(meta.a.weight:is_meta())
    meta:init_weights({ seed = 5, device = 'cpu' })
    local cpu = small({}):init_weights({ seed = 5 })
    assert.equals('cpu', meta.a.weight.device)
    assert.is_true(meta.a.weight.requires_grad)
    assert.is_true(meta.a.weight.is_param)
    local sd_meta, keys = meta:state_dict()
    local sd_cpu = cpu:state_dict()
    for _, k in ipairs(keys) do assert.same(sd_cpu[k]:tolist(), sd_meta[k]:tolist()) end
  end)

  it('keeps tied tensors tied through to_empty and to', function()
    local m = llama_like({ dim = 8, heads = 2, kv = 2, ffn = 8, vocab = 16, layers = 1, tied = true },
                         { device = 'meta' })
    m:init_weights({ seed = 1, device = 'cpu' })
    assert.equals(m.lm_head.weight, m.model.embed_tokens.weight)
    assert.equals('cpu', m.lm_head.weight.device)
    m:to({ dtype = 'bf16' })
    assert.equals(m.lm_head.weight, m.model.embed_tokens.weight)
    assert.equals('bf16', m.lm_head.weight.dtype)
    assert.is_true(m.lm_head.weight.requires_grad)
    assert.same(nn.init.normal(1), m.lm_head.weight.init)
    m:to('f32')
    assert.equals('f32', m.model.norm.weight.dtype)
  end)

  it('runs function rules for computed buffers and leaves rule-less tensors alone', function()
    local Rope = nn.Module:extend('Rope')
    function Rope:__init()
      local t = fsdp.empty({ 4 })
      t.init = function(x, key) x:copy_(fsdp.arange(4, { dtype = 'f32' })); x.seen_name = key.name end
      self:register_buffer('table', t)
      self:register_parameter('fixed', fsdp.full({ 2 }, 9))
    end
    local r = Rope():init_weights({ seed = 0 })
    assert.same({ 0, 1, 2, 3 }, r.table:tolist())
    assert.equals('table', r.table.seen_name)
    assert.same({ 9, 9 }, r.fixed:tolist())
    assert_mentions(error_of(nn.Parameter, { 2 }, { init = { kind = 'bogus' } }), 'unknown init rule kind bogus')
  end)
end)

describe('calling modules', function()
  it('runs pre-hooks and forward hooks, which may replace inputs and outputs', function()
    local m = Scale(10)
    local log = {}
    local h1 = m:register_forward_pre_hook(function(_, x) log[#log + 1] = 'pre' .. x; return x + 1 end)
    local h2 = m:register_forward_hook(function(_, args, out) log[#log + 1] = 'post' .. args[1] .. ':' .. out; return out * 2 end)
    m:register_forward_pre_hook(function() log[#log + 1] = 'first' end, { prepend = true })
    assert.equals(60, m(2)) -- (2 + 1) * 10 * 2
    assert.same({ 'first', 'pre2', 'post3:30' }, log)
    h1.remove(); h2.remove()
    assert.equals(20, m(2))
  end)

  it('names the innermost failing module by its path, once', function()
    local Inner = nn.Module:extend('Inner')
    function Inner:__init() self.fail = Fail() end
    function Inner:forward(x) return self.fail(x) end
    local Outer = nn.Module:extend('Outer')
    function Outer:__init()
      self.layers = nn.ModuleList({ Scale(1), Inner() })
      self.narrow = nn.Module()
    end
    function Outer:forward(x) for _, l in ipairs(self.layers) do x = l(x) end return x end
    local m = Outer()
    local err = error_of(m, 1)
    assert.is_truthy(err:match('^in layers%.1%.fail: .*boom$'), err)
    assert.equals(1, select(2, err:gsub('in layers', '')))
    -- an error from the core inside a forward
    local Bad = nn.Module:extend('Bad')
    function Bad:forward(x) return x:narrow(2, 0, 1) end
    m.narrow = Bad()
    local err2 = error_of(function() return m.narrow(fsdp.zeros({ 2, 2 })) end)
    assert_mentions(err2, 'in narrow: ')
    assert_mentions(err2, 'narrow: dim 2 out of range for a 2-d tensor of shape [2, 2]')
    -- the root has no path: its class names it
    assert.is_truthy(error_of(Fail(), 1):match('^in Fail: .*boom$'))
    assert_mentions(error_of(nn.Module(), 1), 'in Module: ')
    assert_mentions(error_of(nn.Module(), 1), 'Module has no forward()')
  end)
end)

describe('state dicts', function()
  local function net(device)
    local Net = nn.Module:extend('SdNet')
    function Net:__init()
      self.fc = nn.Linear(3, 2, { device = device })
      self:register_buffer('count', fsdp.zeros({ 1 }, { device = device }))
      self:register_buffer('scratch', fsdp.zeros({ 1 }, { device = device }), { persistent = false })
    end
    return Net()
  end

  it('round-trip through load_state_dict, persistent buffers only', function()
    local a = net():init_weights({ seed = 1 })
    a.count:fill_(4)
    local sd, keys = a:state_dict()
    -- PyTorch's order: a module's own parameters and buffers, then its children's
    assert.same({ 'count', 'fc.weight', 'fc.bias' }, keys)
    local b = net():init_weights({ seed = 2 })
    local missing, unexpected = b:load_state_dict(sd)
    assert.same({}, missing)
    assert.same({}, unexpected)
    assert.same(a.fc.weight:tolist(), b.fc.weight:tolist())
    assert.same({ 4 }, b.count:tolist())
  end)

  it('report missing, unexpected and mis-shaped keys by name', function()
    local b = net():init_weights({ seed = 2 })
    local sd = { ['fc.weight'] = fsdp.zeros({ 2, 3 }), extra = fsdp.zeros({ 1 }) }
    assert_mentions(error_of(b.load_state_dict, b, sd), 'missing keys: count, fc.bias; unexpected keys: extra')
    local missing, unexpected = b:load_state_dict(sd, { strict = false })
    assert.same({ 'count', 'fc.bias' }, missing)
    assert.same({ 'extra' }, unexpected)
    assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, b.fc.weight:tolist())
    sd['fc.weight'] = fsdp.zeros({ 3, 2 })
    assert_mentions(error_of(b.load_state_dict, b, sd, { strict = false }),
      'size mismatch for fc.weight: the checkpoint has [3, 2], the model [2, 3]')
  end)

  it('zero_grad drops every gradient', function()
    local a = net():init_weights({ seed = 1 })
    a.fc.weight.grad = fsdp.ones({ 2, 3 })
    a.fc.bias.grad = fsdp.ones({ 2 })
    assert.is_not_nil(a.fc.weight.grad)
    a:zero_grad()
    assert.is_nil(a.fc.weight.grad)
    assert.is_nil(a.fc.bias.grad)
  end)
end)
