-- fsdp.data.synthetic: token batches with structure a model can learn, for
-- smoke tests and CPU training without a dataset.
--
-- A fixed random successor table (from the seed) defines a Markov chain:
-- each next token is succ[token] with probability 1 - noise, else uniform.
-- A model that learns the table reaches the chain's entropy,
--   H = -(q ln q) - (V - 1) (noise/V) ln(noise/V),  q = 1 - noise + noise/V,
-- far below the ln(V) of guessing (M.entropy gives it). Batches depend
-- only on (seed, batch index), so a run is reproducible and resumable.
--
-- Sampling a chain is sequential per row; it runs over ffi arrays (B * T
-- steps per batch, microseconds next to a training step).
local ffi = require 'ffi'
local fsdp = require 'fsdp'

local Markov = {}
Markov.__index = Markov

-- Markov(vocab_size, {seed=0, noise=0.1})
function Markov.new(vocab, opts)
  opts = opts or {}
  local self = setmetatable({ vocab = vocab, noise = opts.noise or 0.1, seed = opts.seed or 0 }, Markov)
  -- successor table: a random permutation, from the counter RNG
  local keys = fsdp.rand({ vocab }, { seed = self.seed, stream = 1, dtype = 'f64' }):tolist()
  local order = {}
  for i = 1, vocab do order[i] = i - 1 end
  table.sort(order, function(a, b) return keys[a + 1] < keys[b + 1] end)
  self.succ = ffi.new('int64_t[?]', vocab)
  for i = 1, vocab do self.succ[order[i]] = order[i % vocab + 1] end
  return self
end

-- Entropy (nats per token) of the chain: the best achievable loss.
function Markov:entropy()
  local V, p = self.vocab, self.noise
  local q = 1 - p + p / V
  local r = p / V
  return -(q * math.log(q)) - (V - 1) * r * math.log(r)
end

-- Batch number `index` (0-based): ids and targets, i64 [B, T], targets the
-- ids shifted by one.
function Markov:batch(index, B, T)
  local n = B * (T + 1)
  local u = fsdp.rand({ n }, { seed = self.seed, stream = 2, offset = index * n, dtype = 'f64' })
  local jump = fsdp.randint(0, self.vocab, { n }, { seed = self.seed, stream = 3, offset = index * n,
                                                    dtype = 'i64' })
  local pu = ffi.cast('double *', u._c.data)
  local pj = ffi.cast('int64_t *', jump._c.data)
  local seq = ffi.new('int64_t[?]', n)
  for b = 0, B - 1 do
    local base = b * (T + 1)
    seq[base] = pj[base]
    for t = 1, T do
      local i = base + t
      seq[i] = pu[i] < self.noise and pj[i] or self.succ[seq[i - 1]]
    end
  end
  local all = fsdp.Tensor.wrap(fsdp.C.fl_from_host(2, ffi.new('int64_t[2]', B, T + 1), fsdp.C.FL_I64,
    fsdp.C.fl_device_make(fsdp.C.FL_DEVICE_CPU, 0), seq, fsdp.C.FL_I64, n))
  return all:narrow(1, 0, T):contiguous(), all:narrow(1, 1, T):contiguous()
end

return { Markov = Markov.new }
