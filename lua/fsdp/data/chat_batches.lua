-- fsdp.data.chat_batches: supervised fine-tuning examples in batches.
-- Conversations (fsdp.data.chat) are rendered with the model's chat
-- template and tokenized once (fsdp.data.chat_tokens), held in memory,
-- and served as padded batches, each rank its slice of the global batch.
--
--   local cb = require 'fsdp.data.chat_batches'
--   local set = cb.load('data/*.jsonl', tpl, tok, {seq_len = 512, train_on = 'assistant', ...chat options})
--   -- set.examples[i] = {ids = i64 [n], targets = i64 [n], trained = count, conv = conversation}
--   local train, held = cb.split(set.examples, 0.1, seed)   -- a held-out fraction, by a seeded shuffle
--   local data = cb.Batches.new(train, {batch_size = 4, seed = 0, pad_id = 0})
--   local ids, targets = data:next()           -- [B, T] this rank's slice, T the batch's longest
--   for ids, targets in val:batches(4) do ... end   -- from the start, in order (validation)
--   data:state() / data:load_state(s)          -- the position a checkpoint stores
--   local packed = cb.Batches.new(train, {batch_size = 4, pack = 512})   -- packed rows of 512 tokens
--   local ids, targets, extra = packed:next()  -- extra: {positions =, segments =} (i64 [B, 512])
--
-- Targets are the labels shifted left (chat_tokens.targets): model:loss
-- takes them as they are, -100 not trained. An example longer than
-- seq_len is cut to its first seq_len tokens (its targets with it; the
-- count is reported); one left with no trained target is dropped and
-- counted, since it would train nothing.
--
-- [Note: SFT batches, padded or packed]
-- Padded (the default): a batch is padded to its longest example (pad_id,
-- targets -100): the attention is causal, so padding on the right changes
-- no real token's output, and the loss (accumulate.token_mean) counts
-- trained tokens only, so padding costs compute, never correctness.
-- Packed (opts.pack = seq_len): each epoch's examples, in that epoch's
-- order, are packed by fsdp.data.packing (first-fit decreasing) into rows
-- of seq_len, with positions restarting and attention confined to each
-- example ([Note: packed sequences] in core/ops/attention.c), so a row's
-- tokens each see what they would see alone. A global batch is
-- batch_size * world rows, rank r taking rows r*B ... r*B+B-1; all ranks
-- pack the same epoch alike, so they agree without a collective. next()
-- then returns ids, targets and {positions =, segments =} for model:loss.
-- The position a checkpoint stores is the epoch and the batches taken of it.
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local chat = require 'fsdp.data.chat'
local chat_tokens = require 'fsdp.data.chat_tokens'
local packing = require 'fsdp.data.packing'
local accumulate = require 'fsdp.sharding.accumulate'
local mesh = require 'fsdp.mesh'

local M = {}

local IGNORE = -100

-- Every conversation of `spec` as an example. opts: seq_len, and chat's
-- options (fields, train_on, bad_records, max_record_bytes). Returns
-- {examples, records, truncated, dropped, skipped, first_skipped}.
function M.load(spec, tpl, tok, opts)
  local it, stats = chat.records(spec, opts)
  local set = { examples = {}, truncated = 0, dropped = 0 }
  for conv in it do
    local ex = chat_tokens.encode(conv, tpl, tok, { train_on = opts.train_on })
    local ids, targets = ex.ids, chat_tokens.targets(ex.labels)
    local n = ids:numel()
    if opts.seq_len and n > opts.seq_len then
      set.truncated = set.truncated + 1
      ids, targets = ids:narrow(0, 0, opts.seq_len):contiguous(), targets:narrow(0, 0, opts.seq_len):contiguous()
    end
    local trained = accumulate.count_tokens(targets)
    if trained == 0 then
      set.dropped = set.dropped + 1
    else
      set.examples[#set.examples + 1] = { ids = ids, targets = targets, trained = trained, conv = conv }
    end
  end
  set.records, set.skipped, set.first_skipped = stats.records, stats.skipped, stats.first
  return set
end

-- A permutation of 1..n from seed (Fisher-Yates on the project's
-- counter-based generator, so every rank draws the same).
local function permutation(n, seed, salt)
  local order = {}
  for i = 1, n do order[i] = i end
  if n < 2 then return order end
  local u = fsdp.rand({ n }, { seed = seed, stream = 31 + (salt or 0), dtype = 'f64' }):tolist()
  for i = n, 2, -1 do
    local j = 1 + math.floor(u[i] * i)
    if j > i then j = i end
    order[i], order[j] = order[j], order[i]
  end
  return order
end
M.permutation = permutation

-- Split examples into (train, held-out): `fraction` of them (at least one
-- when fraction > 0) held out, chosen by a seeded shuffle, each list in
-- the examples' order.
function M.split(examples, fraction, seed)
  local n = #examples
  local k = fraction > 0 and math.max(1, math.floor(n * fraction + 0.5)) or 0
  if k >= n then
    core.fail(('fsdp.data.chat_batches: holding out %g of %d examples leaves none to train on'):format(fraction, n))
  end
  local order = permutation(n, seed, 7919)
  local held_idx = {}
  for i = 1, k do held_idx[order[i]] = true end
  local train, held = {}, {}
  for i, ex in ipairs(examples) do
    if held_idx[i] then held[#held + 1] = ex else train[#train + 1] = ex end
  end
  return train, held
end

local Batches = {}
Batches.__index = Batches
M.Batches = Batches

-- opts: batch_size (per rank), seed, pad_id (0), shuffle (true: a new
-- order every epoch), rank and world (fsdp.dist's by default), pack (nil,
-- or the length of packed rows: [Note: SFT batches, padded or packed]).
function Batches.new(examples, opts)
  if #examples == 0 then core.fail('fsdp.data.chat_batches: no examples to batch') end
  local self = setmetatable({ examples = examples, B = opts.batch_size, seed = opts.seed or 0,
    pad_id = opts.pad_id or 0, shuffle = opts.shuffle ~= false,
    -- the data-parallel ranks ([Note: data-parallel rank and size] in fsdp/mesh.lua)
    rank = opts.rank or mesh.data_parallel_rank(),
    world = opts.world or mesh.data_parallel_size(), epoch = 0, pos = 0, pack = opts.pack }, Batches)
  self.order = self.shuffle and permutation(#examples, self.seed, self.epoch) or nil
  if self.pack then self:pack_epoch() end
  return self
end

-- Packed: the epoch's global batches, packed in its order (every rank
-- alike), and their real tokens over their slots.
function Batches:pack_epoch()
  local list = {}
  for i = 1, #self.examples do list[i] = self.examples[self.order and self.order[i] or i] end
  local packer = packing.new(list, { seq_len = self.pack, batch_size = self.B * self.world, pad_id = self.pad_id })
  self.packed = {}
  for b in packer:batches() do self.packed[#self.packed + 1] = b end
  self.fraction = packer:stats().fraction
end

function Batches:steps_per_epoch()
  if self.pack then return #self.packed end
  return math.max(1, math.floor(#self.examples / (self.B * self.world)))
end

-- Packed: this rank's rows of the next global batch, and their positions
-- and segments.
function Batches:next_packed()
  if self.pos >= #self.packed then
    self.epoch, self.pos = self.epoch + 1, 0
    if self.shuffle then self.order = permutation(#self.examples, self.seed, self.epoch) end
    self:pack_epoch()
  end
  self.pos = self.pos + 1
  local b, r, B = self.packed[self.pos], self.rank * self.B, self.B
  local function mine(t) return t:narrow(0, r, B) end
  return mine(b.ids), mine(b.targets), { positions = mine(b.positions), segments = mine(b.segments) }
end

-- The examples at these indices as one padded batch.
function Batches:pad(list)
  local T = 0
  for _, ex in ipairs(list) do T = math.max(T, ex.ids:numel()) end
  local B = #list
  local ids = fsdp.full({ B, T }, self.pad_id, { dtype = 'i64' })
  local targets = fsdp.full({ B, T }, IGNORE, { dtype = 'i64' })
  for b, ex in ipairs(list) do
    local n = ex.ids:numel()
    ids:select(0, b - 1):narrow(0, 0, n):copy_(ex.ids)
    targets:select(0, b - 1):narrow(0, 0, n):copy_(ex.targets)
  end
  return ids, targets
end

-- This rank's slice of the next global batch (B * world examples of the
-- epoch's order; a new order each epoch).
function Batches:next()
  if self.pack then return self:next_packed() end
  local G = self.B * self.world
  local n = #self.examples
  if self.pos + G > n then
    self.epoch, self.pos = self.epoch + 1, 0
    if self.shuffle then self.order = permutation(n, self.seed, self.epoch) end
  end
  local list = {}
  for j = 1, self.B do
    -- (a dataset smaller than a global batch wraps around)
    local k = (self.pos + self.rank * self.B + j - 1) % n + 1
    list[j] = self.examples[self.order and self.order[k] or k]
  end
  self.pos = self.pos + G
  return self:pad(list)
end

-- Up to n batches from the start in order (every example once; 0 or nil:
-- all of them), each rank its slice; a slice past the end is one padding
-- row with no target, so that every rank runs as many forwards.
function Batches:batches(n)
  local G = self.B * self.world
  local total = math.ceil(#self.examples / G)
  if n and n > 0 then total = math.min(total, n) end
  local i = 0
  return function()
    if i >= total then return nil end
    local list = {}
    for j = 1, self.B do
      local k = i * G + self.rank * self.B + j
      if self.examples[k] then list[#list + 1] = self.examples[k] end
    end
    i = i + 1
    if #list == 0 then
      return fsdp.full({ 1, 1 }, self.pad_id, { dtype = 'i64' }), fsdp.full({ 1, 1 }, IGNORE, { dtype = 'i64' })
    end
    return self:pad(list)
  end
end

function Batches:state() return { kind = 'chat', epoch = self.epoch, pos = self.pos, seed = self.seed,
                                  examples = #self.examples, pack = self.pack } end

function Batches:load_state(s)
  if type(s) ~= 'table' or s.kind ~= 'chat' then
    core.fail(('fsdp.data.chat_batches: the checkpoint\'s data position is %s, not chat batches'):format(
      type(s) == 'table' and tostring(s.kind) or type(s)))
  end
  if s.examples ~= #self.examples then
    core.fail(('fsdp.data.chat_batches: the checkpoint was trained on %d examples, this data holds %d (the data '
      .. 'changed)'):format(s.examples, #self.examples))
  end
  if s.pack ~= self.pack then
    core.fail(('fsdp.data.chat_batches: the checkpoint\'s batches were %s, these are %s (give the run\'s own '
      .. '--packing and --seq_len)'):format(s.pack and ('packed in rows of ' .. s.pack) or 'padded',
      self.pack and ('packed in rows of ' .. self.pack) or 'padded'))
  end
  self.epoch, self.pos, self.seed = s.epoch, s.pos, s.seed
  if self.shuffle then self.order = permutation(#self.examples, self.seed, self.epoch) end
  if self.pack then self:pack_epoch() end
end

function Batches:__tostring()
  if self.pack then
    return ('%d conversations packed in rows of %d tokens (%.1f%% real), %d rows per rank and batch'):format(
      #self.examples, self.pack, 100 * self.fraction, self.B)
  end
  return ('%d conversations, %d per rank and batch'):format(#self.examples, self.B)
end

return M
