-- fsdp.data.pairs: source/target text pairs for T5, from JSONL, tokenized
-- at load, behind the interface of the token datasets (next, batches,
-- state, load_state).
--
--   local pairs_data = require 'fsdp.data.pairs'
--   local ds = pairs_data.open('pairs.jsonl', { tokenizer = 'byte', source_len = 64, target_len = 32,
--                                               batch_size = 8, source_field = 'source', target_field = 'target' })
--   local input_ids, labels, mask = ds:next()     -- i64 [8, 64], i64 [8, 32], i64 [8, 64]
--   local loss = t5_model:loss(input_ids, labels, { attention_mask = mask })
--
-- Each side is truncated to leave room for the tokenizer's EOS, which ends
-- it. Sources are padded with pad_id (0, T5's pad); labels with -100 (the
-- ignore index of the loss, which T5's shift_right turns into pad); the
-- source's attention mask (1 up to its EOS, 0 after) comes with each
-- batch, from the lengths rather than from the pad id, which a
-- tokenizer may also use for a real token (SentencePiece's unk is 0). The
-- val split is every k-th pair by the rule of tools/tokenize.lua (pair k
-- is validation when floor((k+1)f) > floor(kf), f = val_fraction). The
-- order, the ranks' parts and the state follow fsdp.data.sampler. The
-- file is read whole at open, so the position records its size and the
-- XXH3-64 of all of it, and load_state refuses a file that changed since
-- (or says it and goes on, with data_changed = 'continue'; [Note: the
-- fingerprint of a data position] in fsdp.data.corpus).
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local cjson = require 'cjson'
local Sampler = require 'fsdp.data.sampler'
local tokenizer = require 'fsdp.data.tokenizer'
local utf8 = require 'fsdp.data.utf8'
local changes = require 'fsdp.data.changes'
local console = require 'fsdp.observe.console'
local files = require 'fsdp.io.files'
local mesh = require 'fsdp.mesh'

local M = {}

local function fail(fmt, ...) core.fail('fsdp.data.pairs: ' .. fmt:format(...)) end

local Dataset = {}
Dataset.__index = Dataset

-- [n, len] i64 of the id tensors, each truncated to len - 1, then EOS,
-- then `pad`; the mask of the ids and EOS, [n, len] i64; and how many
-- rows were truncated.
local function pad_rows(ids, len, eos, pad)
  local out = fsdp.full({ #ids, len }, pad, { dtype = 'i64' })
  local mask = fsdp.zeros({ #ids, len }, { dtype = 'i64' })
  local truncated = 0
  for i, t in ipairs(ids) do
    if t:numel() > len - 1 then truncated = truncated + 1 end
    local n = math.min(t:numel(), len - 1)
    local row = out:select(0, i - 1)
    if n > 0 then row:narrow(0, 0, n):copy_(t:narrow(0, 0, n)) end
    row:set(eos, n)
    mask:select(0, i - 1):narrow(0, 0, n + 1):fill_(1)
  end
  return out, mask, truncated
end

-- opts: tokenizer ('byte', a tokenizer file or model directory as
-- fsdp.data.tokenizer.load takes them, or a loaded tokenizer), source_field/target_field ('source'/'target'), source_len,
-- target_len, split ('train' or 'val'), val_fraction (0), pad_id (0),
-- batch_size, cap_batch (lower batch_size to what the split holds for
-- the world size: floor(n / world_size), for validation splits smaller
-- than a global batch), seed, shuffle, rank/world_size, data_changed
-- ('stop' or 'continue': what load_state does when the file changed). An
-- empty split is an error naming the file, the split and its fraction.
function M.open(path, opts)
  local sf, tf = opts.source_field or 'source', opts.target_field or 'target'
  -- (a regular file, read whole within a bound: its fingerprint is of all of it)
  local content, err = files.read(path, files.LIMITS.data[1], 'a pairs file')
  if not content then fail('cannot read pairs: %s', err) end
  local split, frac = opts.split or 'train', opts.val_fraction or 0
  if split ~= 'train' and split ~= 'val' then fail("split must be 'train' or 'val', got %s", tostring(split)) end
  local data_changed = changes.policy(opts.data_changed, 'fsdp.data.pairs: open ' .. path)
  local sources, targets, k, line = {}, {}, 0, 0
  for text in content:gmatch('([^\n]*)\n?') do
    line = line + 1
    if text:match('%S') then
      local ok, obj = pcall(cjson.decode, text)
      if not ok or type(obj) ~= 'table' then fail('%s:%d: not a JSON object', path, line) end
      local s, t = obj[sf], obj[tf]
      if type(s) ~= 'string' or type(t) ~= 'string' then
        fail('%s:%d: needs string fields %q and %q', path, line, sf, tf)
      end
      -- cjson passes any bytes through; a tokenizer would encode invalid
      -- UTF-8 without a word (BPE: U+FFFD, SentencePiece: unk)
      for _, field in ipairs({ { sf, s }, { tf, t } }) do
        local bad = utf8.first_invalid(field[2])
        if bad then
          fail('%s:%d: field %q is not valid UTF-8 (its byte %d)', path, line, field[1], bad - 1)
        end
      end
      local is_val = math.floor((k + 1) * frac) > math.floor(k * frac)
      if is_val == (split == 'val') then
        sources[#sources + 1], targets[#targets + 1] = s, t
      end
      k = k + 1
    end
  end
  if #sources == 0 then
    fail('%s: the %s split is empty (%d pairs in the file, val_fraction %g)', path, split, k, frac)
  end
  local tok = type(opts.tokenizer) == 'table' and opts.tokenizer or tokenizer.load(opts.tokenizer)
  for _, key in ipairs({ 'source_len', 'target_len' }) do
    if type(opts[key]) ~= 'number' or opts[key] < 2 then fail('%s must be a number >= 2', key) end
  end
  local self = setmetatable({ path = path, split = split, tokenizer = tok, n = #sources, data_changed = data_changed,
    size = #content, fingerprint = changes.hash(content) }, Dataset)
  self.vocab_size, self.eos_id = tok.vocab_size, tok.eos_id
  -- truncated: how many sources and targets lost tokens to the lengths.
  self.truncated = {}
  self.sources, self.source_mask, self.truncated.source = pad_rows(tok:encode(sources), opts.source_len, tok.eos_id,
                                                                   opts.pad_id or 0)
  local _
  self.labels, _, self.truncated.target = pad_rows(tok:encode(targets), opts.target_len, tok.eos_id, -100)
  self.seed = opts.seed or 0
  local rank, world = opts.rank, opts.world_size
  if rank == nil or world == nil then -- the data-parallel ranks ([Note: data-parallel rank and size] in fsdp/mesh.lua)
    rank, world = rank or mesh.data_parallel_rank(), world or mesh.data_parallel_size()
  end
  local batch = opts.batch_size
  if opts.cap_batch and type(batch) == 'number' then batch = math.max(1, math.min(batch, math.floor(self.n / world))) end
  self.batch_size = batch
  self.sampler = Sampler.new({ n = self.n, batch_size = batch, seed = self.seed, shuffle = opts.shuffle,
    rank = rank, world_size = world, name = ('fsdp.data.pairs: %s (%s split, %d pairs)'):format(path, split, self.n) })
  return self
end

-- The pairs of 0-based ids idx: input_ids, labels, attention_mask.
function Dataset:gather(idx)
  local src, lab, mask = {}, {}, {}
  for b, i in ipairs(idx) do
    src[b], lab[b], mask[b] = self.sources:narrow(0, i, 1), self.labels:narrow(0, i, 1), self.source_mask:narrow(0, i, 1)
  end
  return fsdp.cat(src, 0), fsdp.cat(lab, 0), fsdp.cat(mask, 0)
end

function Dataset:next() return self:gather((self.sampler:next())) end

function Dataset:batches(n) return self.sampler:gather_batches(self, n) end

function Dataset:state()
  local s = self.sampler:state()
  return { kind = 'pairs', epoch = s.epoch, position = s.position, seed = self.seed, n = self.n,
           files = { { self.path, self.size, self.fingerprint } } }
end

function Dataset:load_state(s)
  if type(s) ~= 'table' or s.kind ~= 'pairs' or s.seed ~= self.seed then
    fail('%s: the saved position is not for these %d pairs with seed %d', self.path, self.n, self.seed)
  end
  local found = {}
  if s.files == nil then
    console.print_all(('data: %s: the saved position has no fingerprint (saved by an '
      .. 'older fsdp-lua): resuming without checking the file'):format(self.path))
  elseif not changes.valid_listing(s.files) then
    fail('%s: the saved position\'s fingerprint is damaged', self.path)
  else
    found = changes.listing(s.files, { self.path }, { self.size }, { self.fingerprint }, false)
  end
  changes.refuse(self.data_changed, found)
  if s.n ~= self.n and #found == 0 then
    fail('%s: the saved position is not for these %d pairs with seed %d', self.path, self.n, self.seed)
  end
  changes.apply(self.data_changed, found)
  if s.n ~= self.n and type(s.position) == 'number' then
    -- going on over other pairs: the same epoch, at most its new length in
    local gb = self.sampler.global_batch
    s = { epoch = s.epoch, position = math.min(s.position - s.position % gb, self.sampler.steps_per_epoch * gb) }
  end
  self.sampler:load_state(s)
end

function Dataset:__tostring()
  return ('TextPairs(%s, %s: %d pairs, %s)'):format(self.path, self.split, self.n, tostring(self.tokenizer))
end

return M
