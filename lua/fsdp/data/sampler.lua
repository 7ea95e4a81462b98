-- fsdp.data.sampler: which examples each rank reads at each step, for
-- every dataset of fsdp.data (token shards, images, text pairs).
--
--   local Sampler = require 'fsdp.data.sampler'
--   local s = Sampler.new({ n = 1000, batch_size = 8, seed = 0, rank = r, world_size = W })
--   local idx, epoch = s:next()        -- this rank's 8 example ids (0-based) of the next step
--   local st = s:state()               -- {epoch =, position =}: a plain table to checkpoint
--   s:load_state(st)                   -- the next s:next() is the batch that followed st
--
-- The contract (what makes runs reproducible and resumable):
--   * The order of epoch e is a permutation of [0, n) that depends only on
--     (seed, e, n), never on the world size or the batch size. Without
--     shuffling it is the identity.
--   * Global step k of an epoch reads positions [k*G, (k+1)*G) of that
--     order, G = batch_size * world_size; rank r reads its consecutive
--     batch_size positions at k*G + r*batch_size. The ranks of a step read
--     distinct examples, and W ranks with batch b see exactly the batches
--     of one rank with batch W*b.
--   * An epoch has floor(n / G) steps (the incomplete last global batch is
--     dropped, so every step has the same shape); then the next epoch
--     starts at position 0 with a new order.
--   * The state is (epoch, position), position counting global examples
--     consumed in the epoch; restoring it continues with exactly the next
--     batch. A state saved at world size W loads at W' when position is a
--     multiple of the new G (e.g. same global batch); otherwise the error
--     says so.
--
-- The permutation is a keyed Feistel network over the smallest power of 4
-- >= n, walked until it lands inside [0, n) ("cycle walking"): a bijection
-- computed per index in O(1) time and memory, so corpora of billions of
-- sequences need no index array, and any position is reachable at once.
local bit = require 'bit'
local core = require 'fsdp.core'
-- the data-parallel ranks: a TP group shares its batches ([Note: data-parallel rank and size] in
-- fsdp/mesh.lua)
local mesh = require 'fsdp.mesh'

local Sampler = {}
Sampler.__index = Sampler

local ROUNDS = 6

-- splitmix64's finaliser: a good 64-bit mix (uint64 cdata wraps mod 2^64).
local function mix(x)
  x = bit.bxor(x, bit.rshift(x, 30)) * 0xbf58476d1ce4e5b9ULL
  x = bit.bxor(x, bit.rshift(x, 27)) * 0x94d049bb133111ebULL
  return bit.bxor(x, bit.rshift(x, 31))
end

local function check_int(v, what, min)
  if type(v) ~= 'number' or v ~= math.floor(v) or v < min then
    core.fail(('fsdp.data.sampler: %s must be an integer >= %d, got %s'):format(what, min, tostring(v)))
  end
end

-- opts: n (examples), batch_size (per rank), seed (default 0), shuffle
-- (default true), rank and world_size (default: fsdp.mesh.data_parallel_rank/size()), name (for
-- messages, e.g. the dataset path).
function Sampler.new(opts)
  local self = setmetatable({}, Sampler)
  self.name = opts.name or 'dataset'
  self.n, self.batch_size = opts.n, opts.batch_size
  check_int(self.n, 'n', 0)
  check_int(self.batch_size, 'batch_size', 1)
  self.seed = opts.seed or 0
  check_int(self.seed, 'seed', 0)
  self.shuffle = opts.shuffle ~= false
  if opts.rank == nil or opts.world_size == nil then
    self.rank, self.world_size = opts.rank or mesh.data_parallel_rank(),
      opts.world_size or mesh.data_parallel_size()
  else
    self.rank, self.world_size = opts.rank, opts.world_size
  end
  check_int(self.world_size, 'world_size', 1)
  check_int(self.rank, 'rank', 0)
  self.global_batch = self.batch_size * self.world_size
  self.steps_per_epoch = math.floor(self.n / self.global_batch)
  if self.steps_per_epoch == 0 then
    core.fail(('%s: %d examples are fewer than one global batch of %d (batch_size %d x %d ranks)'):format(
      self.name, self.n, self.global_batch, self.batch_size, self.world_size))
  end
  -- Feistel halves of h bits each: the domain 4^h is the smallest power
  -- of 4 >= n (at least 4), so a walk takes under 4 rounds on average.
  local h = 1
  while 4 ^ h < self.n do h = h + 1 end
  self.half_bits = h
  self.half_mask = 2 ^ h - 1
  self.epoch, self.position = 0, 0
  self:_set_epoch(0)
  return self
end

function Sampler:_set_epoch(e)
  self.epoch = e
  self.keys = {}
  local k = mix(0x9e3779b97f4a7c15ULL * (self.seed + 1) + e)
  for i = 1, ROUNDS do
    k = mix(k + i)
    self.keys[i] = k
  end
end

-- The example at position p (0-based) of the current epoch's order.
function Sampler:index(p)
  if not self.shuffle then return p end
  local h, mask, keys = self.half_bits, self.half_mask, self.keys
  local x = p
  repeat
    local l, r = math.floor(x / 2 ^ h), x % 2 ^ h
    for i = 1, ROUNDS do
      local f = tonumber(bit.band(mix(keys[i] + r), 0xffffffffULL)) % (mask + 1)
      l, r = r, (l + f) % (mask + 1)
    end
    x = l * 2 ^ h + r
  until x < self.n
  return x
end

-- This rank's example ids for the next step (a Lua array, 0-based) and the
-- epoch they belong to; advances the position.
function Sampler:next()
  if self.position + self.global_batch > self.steps_per_epoch * self.global_batch then
    self:_set_epoch(self.epoch + 1)
    self.position = 0
  end
  local first = self.position + self.rank * self.batch_size
  local out = {}
  for j = 0, self.batch_size - 1 do out[j + 1] = self:index(first + j) end
  self.position = self.position + self.global_batch
  return out, self.epoch
end

-- An iterator over the first n global batches in order (unshuffled), each
-- as this rank's example ids: fixed validation batches, so every
-- evaluation sees the same examples. n is capped at the batches there are.
function Sampler:fixed_batches(n)
  n = math.min(n or self.steps_per_epoch, self.steps_per_epoch)
  local k = 0
  return function()
    if k >= n then return nil end
    local first = k * self.global_batch + self.rank * self.batch_size
    local ids = {}
    for j = 1, self.batch_size do ids[j] = first + j - 1 end
    k = k + 1
    return ids
  end
end

-- The batches of fixed_batches(n) gathered by dataset:gather(ids).
function Sampler:gather_batches(dataset, n)
  local it = self:fixed_batches(n)
  return function()
    local ids = it()
    if ids then return dataset:gather(ids) end
    return nil
  end
end

function Sampler:state()
  return { epoch = self.epoch, position = self.position }
end

function Sampler:load_state(s)
  if type(s) ~= 'table' or type(s.epoch) ~= 'number' or type(s.position) ~= 'number' then
    core.fail(('%s: load_state expects {epoch =, position =}, got %s'):format(self.name, tostring(s)))
  end
  for _, k in ipairs({ 'epoch', 'position' }) do
    local v = s[k]
    if v ~= math.floor(v) or v < 0 or v > 2 ^ 53 then
      core.fail(('%s: saved %s %s is not an integer from 0 (a damaged position)'):format(self.name, k, tostring(v)))
    end
  end
  if s.position % self.global_batch ~= 0 or s.position > self.steps_per_epoch * self.global_batch then
    core.fail(('%s: saved position %d is not a step boundary for a global batch of %d (batch_size %d x %d ranks)')
      :format(self.name, s.position, self.global_batch, self.batch_size, self.world_size))
  end
  self:_set_epoch(s.epoch)
  self.position = s.position
end

return Sampler
