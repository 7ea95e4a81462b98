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
--
-- Targets are the labels shifted left (chat_tokens.targets): model:loss
-- takes them as they are, -100 not trained. An example longer than
-- seq_len is cut to its first seq_len tokens (its targets with it; the
-- count is reported); one left with no trained target is dropped and
-- counted, since it would train nothing.
--
-- [Note: SFT batches are padded, not packed]
-- A batch is padded to its longest example (pad_id, targets -100): the
-- attention is causal, so padding on the right changes no real token's
-- output, and the loss (accumulate.token_mean) counts trained tokens only,
-- so padding costs compute, never correctness. Packing several examples
-- into one sequence (block-diagonal attention) saves that compute; it
-- belongs in a packer between the examples and the batches (the examples
-- list is what a packer takes), not here.
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local chat = require 'fsdp.data.chat'
local chat_tokens = require 'fsdp.data.chat_tokens'

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
    local trained = require('fsdp.sharding.accumulate').count_tokens(targets)
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
-- order every epoch), rank and world (fsdp.dist's by default).
function Batches.new(examples, opts)
  if #examples == 0 then core.fail('fsdp.data.chat_batches: no examples to batch') end
  local self = setmetatable({ examples = examples, B = opts.batch_size, seed = opts.seed or 0,
    pad_id = opts.pad_id or 0, shuffle = opts.shuffle ~= false, rank = opts.rank or fsdp.dist.rank(),
    world = opts.world or fsdp.dist.world_size(), epoch = 0, pos = 0 }, Batches)
  self.order = self.shuffle and permutation(#examples, self.seed, self.epoch) or nil
  return self
end

function Batches:steps_per_epoch() return math.max(1, math.floor(#self.examples / (self.B * self.world))) end

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
                                  examples = #self.examples } end

function Batches:load_state(s)
  if type(s) ~= 'table' or s.kind ~= 'chat' then
    core.fail(('fsdp.data.chat_batches: the checkpoint\'s data position is %s, not chat batches'):format(
      type(s) == 'table' and tostring(s.kind) or type(s)))
  end
  if s.examples ~= #self.examples then
    core.fail(('fsdp.data.chat_batches: the checkpoint was trained on %d examples, this data holds %d (the data '
      .. 'changed)'):format(s.examples, #self.examples))
  end
  self.epoch, self.pos, self.seed = s.epoch, s.pos, s.seed
  if self.shuffle then self.order = permutation(#self.examples, self.seed, self.epoch) end
end

function Batches:__tostring()
  return ('%d conversations, %d per rank and batch'):format(#self.examples, self.B)
end

return M
