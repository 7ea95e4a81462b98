-- fsdp.data.synthetic_tokens: the synthetic Markov source (fsdp.data.synthetic)
-- behind the same interface as token shards (fsdp.data.tokens), so a recipe
-- switches between them with one option:
--
--   local src = require('fsdp.data.synthetic_tokens').new(vocab, { batch_size = 4, seq_len = 128, seed = 0 })
--   local ids, targets = src:next()      -- i64 [4, 128]
--   src:state() / src:load_state(s)      -- {kind = 'synthetic', step =}
--   for ids, targets in src:batches(4) do ... end   -- fixed validation batches
--
-- Batch k of rank r is the chain's batch k * world_size + r, so ranks read
-- distinct data; validation batches come from a far region of the same
-- chain (index 2^30 on), never seen in training.
local core = require 'fsdp.core'
local synthetic = require 'fsdp.data.synthetic'
-- the data-parallel ranks: a TP group shares its batches ([Note: data-parallel rank and size] in
-- fsdp/mesh.lua)
local mesh = require 'fsdp.mesh'

local Source = {}
Source.__index = Source

local VAL_BASE = 2 ^ 30

-- opts: batch_size, seq_len, seed (0), noise (0.1), rank/world_size
-- (default: fsdp.mesh.data_parallel_rank/size()).
function Source.new(vocab, opts)
  local self = setmetatable({}, Source)
  self.chain = synthetic.Markov(vocab, { seed = opts.seed, noise = opts.noise })
  self.vocab_size, self.batch_size, self.seq_len = vocab, opts.batch_size, opts.seq_len
  self.seed = opts.seed or 0
  if opts.rank == nil or opts.world_size == nil then
    self.rank, self.world_size = opts.rank or mesh.data_parallel_rank(),
      opts.world_size or mesh.data_parallel_size()
  else
    self.rank, self.world_size = opts.rank, opts.world_size
  end
  self.step = 0
  return self
end

function Source:entropy() return self.chain:entropy() end

function Source:next()
  local k = self.step * self.world_size + self.rank
  self.step = self.step + 1
  return self.chain:batch(k, self.batch_size, self.seq_len)
end

function Source:batches(n)
  local k = 0
  return function()
    if k >= n then return nil end
    k = k + 1
    return self.chain:batch(VAL_BASE + (k - 1) * self.world_size + self.rank, self.batch_size, self.seq_len)
  end
end

-- The position: micro-batches read per rank, and the data-parallel world
-- they were read by, so a resume on another number of data-parallel
-- ranks (a checkpoint across meshes) continues at the same chain batch.
function Source:state()
  return { kind = 'synthetic', step = self.step, seed = self.seed, world_size = self.world_size }
end

function Source:load_state(s)
  if type(s) ~= 'table' or s.kind ~= 'synthetic' or type(s.step) ~= 'number' then
    core.fail(('fsdp.data.synthetic_tokens: load_state expects {kind = "synthetic", step =}, got %s'):format(
      type(s) == 'table' and ('kind ' .. tostring(s.kind)) or tostring(s)))
  end
  if s.seed ~= self.seed then
    core.fail(('fsdp.data.synthetic_tokens: the saved position is for seed %s, this source has seed %d'):format(
      tostring(s.seed), self.seed))
  end
  local step = s.step
  if type(s.world_size) == 'number' and s.world_size ~= self.world_size then
    -- chain batches 0 .. step * W - 1 were read, W' ranks go on from there
    local read = step * s.world_size
    if read % self.world_size ~= 0 then
      core.fail(('fsdp.data.synthetic_tokens: the saved position (%d batches on each of %d data-parallel ranks) '
        .. 'does not continue on %d ranks'):format(step, s.world_size, self.world_size))
    end
    step = read / self.world_size
  end
  self.step = step
end

function Source:__tostring()
  return ('SyntheticTokens(Markov chain over %d tokens, entropy %.3f nats/token)'):format(self.vocab_size,
    self:entropy())
end

return Source
