-- fsdp.data.tokens: binary token shards, memory-mapped, packed into fixed
-- length sequences, shuffled, split across ranks, resumable.
--
--   local tokens = require 'fsdp.data.tokens'
--   local train = tokens.open('data/corpus', { split = 'train', seq_len = 2048, batch_size = 4, seed = 0 })
--   local ids, targets = train:next()           -- i64 [4, 2048] each, targets = ids shifted by one
--   local st = train:state()                     -- a plain table for the checkpoint
--   train:load_state(st)                         -- continues with exactly the next batch
--   for ids, targets in val:batches(8) do ... end   -- the first 8 batches in order (validation)
--
-- The file format. A shard is a safetensors file (validated and mapped by
-- the core's reader, so a token is never copied until a batch needs it)
-- holding one 1-d tensor `tokens` of dtype u16 (vocabularies up to 65536)
-- or u32, and string metadata:
--   format = "fsdp-tokens", version = "1", vocab_size, eos_id,
--   documents (how many documents the shard holds), tokenizer (a description).
-- Documents are stored back to back, each followed by eos_id. A dataset is
-- a directory of shards named <split>-NNNNN.safetensors (tools/tokenize.lua
-- writes train-* and val-*), or a single shard file. All shards of a split
-- must agree on dtype, vocab_size and eos_id.
--
-- Packing: the split's shards, in name order, form one token stream of N
-- tokens; sequence i is the T + 1 tokens from i*T (T = seq_len), ids its
-- first T and targets its last T, so consecutive sequences share one token
-- and none is wasted; there are floor((N - 1) / T) sequences. A sequence
-- may span documents (the EOS between them tells the model) and shards.
-- Which sequences a rank reads at each step, the shuffling and the epochs
-- follow fsdp.data.sampler's contract.
--
-- The position records the shards it stands on ([Note: the fingerprint of
-- a data position] in fsdp.data.corpus): each shard's name, size and an
-- XXH3-64 of the first and last SAMPLE bytes of its tokens (through the
-- mapping, once at open; not the header, whose metadata a writer may
-- order otherwise for the same tokens); rank 0's position holds the
-- list, every rank's its digest. Every step reads anywhere in every shard, so there is
-- no prefix to check byte for byte: a shard added, removed, replaced
-- (another size: a shard never grows) or rewritten with other first or
-- last tokens is seen; an edit inside a shard keeping its size is not
-- (that would mean reading every shard at every resume). load_state then
-- refuses, or with data_changed = 'continue' says it and goes on.
local ffi = require 'ffi'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local fsdp = require 'fsdp'
local safetensors = require 'fsdp.io.safetensors'
local Sampler = require 'fsdp.data.sampler'
local changes = require 'fsdp.data.changes'
local lfs = require 'lfs'
local console = require 'fsdp.observe.console'

local SAMPLE = 64 * 1024

local M = {}
M.FORMAT, M.VERSION = 'fsdp-tokens', '1'

local function fail(fmt, ...) core.fail('fsdp.data.tokens: ' .. fmt:format(...)) end

-- The dtype that holds ids below vocab_size.
function M.dtype_for(vocab_size)
  return vocab_size <= 65536 and 'u16' or 'u32'
end

-- Write one shard: tokens (a 1-d integer tensor, converted to the dtype
-- the vocabulary needs) with meta = {vocab_size =, eos_id =, documents =,
-- tokenizer =}. Atomic (temporary file, fsync, rename).
function M.write_shard(path, toks, meta)
  if type(meta.vocab_size) ~= 'number' or type(meta.eos_id) ~= 'number' then
    fail('write_shard %s: meta needs vocab_size and eos_id', path)
  end
  local dtype = M.dtype_for(meta.vocab_size)
  if toks.dtype ~= dtype then toks = toks:to(dtype) end
  safetensors.save(path, { { 'tokens', toks:contiguous() } }, {
    format = M.FORMAT, version = M.VERSION, vocab_size = meta.vocab_size, eos_id = meta.eos_id,
    documents = meta.documents or 0, tokenizer = meta.tokenizer or 'unknown' })
end

-- The shard files of a split: a file as given, or <dir>/<split>-*.safetensors.
function M.shard_paths(path, split)
  local mode, err = lfs.attributes(path, 'mode')
  if not mode then fail('%s: %s', path, err or 'no such file or directory') end
  if mode == 'file' then return { path } end
  local files = {}
  local pattern = '^' .. split:gsub('%p', '%%%0') .. '%-%d+%.safetensors$'
  for name in lfs.dir(path) do
    if name:match(pattern) then files[#files + 1] = path .. '/' .. name end
  end
  table.sort(files)
  return files
end

-- A shard's header and mapped tokens, checked to be a token shard.
local function open_shard(path)
  local ok, f = pcall(safetensors.open, path)
  if not ok then
    -- the reader's message already names the file; drop its source position
    fail('not a readable token shard: %s', (tostring(f):gsub('^[^:\n]*:%d+: ', '')))
  end
  local meta = f:metadata()
  if meta.format ~= M.FORMAT then
    fail('%s is a safetensors file but not a token shard (metadata format = %s, expected %q; '
      .. 'write shards with tools/tokenize.lua)', path, tostring(meta.format), M.FORMAT)
  end
  if meta.version ~= M.VERSION then
    fail('%s: token shard version %s, this reader knows version %s', path, tostring(meta.version), M.VERSION)
  end
  local info = f:info('tokens')
  if #info.shape ~= 1 or (info.dtype ~= 'u16' and info.dtype ~= 'u32') then
    fail('%s: tokens must be a 1-d u16 or u32 tensor, found %s [%s]', path, info.dtype,
      table.concat(info.shape, ', '))
  end
  local vocab, eos = tonumber(meta.vocab_size), tonumber(meta.eos_id)
  if validate.problem(vocab, validate.COUNT) or validate.problem(eos, { int = true, min = 0, below = vocab }) then
    fail('%s: bad metadata vocab_size=%s eos_id=%s', path, tostring(meta.vocab_size), tostring(meta.eos_id))
  end
  return { path = path, tokens = f:get('tokens'), n = info.shape[1], dtype = info.dtype,
           vocab_size = vocab, eos_id = eos, documents = tonumber(meta.documents) or 0,
           tokenizer = meta.tokenizer }
end

-- A shard's size and fingerprint (see the top): the first and last
-- SAMPLE bytes of its mapped tokens.
local function shard_print(s)
  local n = s.n * (s.dtype == 'u16' and 2 or 4)
  local k = math.min(SAMPLE, n)
  local base = ffi.cast('const char *', s.tokens._c.data)
  local C = core.C
  return lfs.attributes(s.path, 'size'),
    changes.hash(changes.hex(C.fl_checksum(base, k)) .. changes.hex(C.fl_checksum(base + (n - k), k)))
end

local Dataset = {}
Dataset.__index = Dataset
M.Dataset = Dataset

-- Open a split. opts: split ('train'), seq_len, batch_size (per rank),
-- seed (0), shuffle (true), rank/world_size (default: fsdp.dist's),
-- data_changed ('stop' or 'continue': what load_state does with a position
-- whose shards changed).
function M.open(path, opts)
  opts = opts or {}
  local split = opts.split or 'train'
  if type(path) ~= 'string' or path == '' then fail('open: expected a path, got %s', tostring(path)) end
  local paths = M.shard_paths(path, split)
  if #paths == 0 then fail('%s holds no %s-NNNNN.safetensors shards', path, split) end
  local self = setmetatable({ path = path, split = split, shards = {}, starts = {},
    data_changed = changes.policy(opts.data_changed, 'fsdp.data.tokens: open ' .. path),
    _sizes = {}, _prints = {} }, Dataset)
  local total = 0
  local lines = {}
  for i, p in ipairs(paths) do
    local s = open_shard(p)
    self._sizes[i], self._prints[i] = shard_print(s)
    lines[i] = ('%s %d %s'):format(p, self._sizes[i], self._prints[i])
    local first = self.shards[1]
    if first and (s.dtype ~= first.dtype or s.vocab_size ~= first.vocab_size or s.eos_id ~= first.eos_id) then
      fail('%s (%s, vocab %d, eos %d) does not match %s (%s, vocab %d, eos %d)', p, s.dtype, s.vocab_size,
        s.eos_id, first.path, first.dtype, first.vocab_size, first.eos_id)
    end
    self.shards[i], self.starts[i] = s, total
    total = total + s.n
  end
  self._paths, self._digest = paths, changes.hash(table.concat(lines, '\n'))
  local s1 = self.shards[1]
  self.vocab_size, self.eos_id, self.tokenizer = s1.vocab_size, s1.eos_id, s1.tokenizer
  self.num_tokens = total
  self.seq_len = opts.seq_len
  if validate.problem(self.seq_len, validate.COUNT) then fail('open: seq_len must be an integer >= 1') end
  self.num_sequences = math.max(0, math.floor((total - 1) / self.seq_len))
  self.batch_size = opts.batch_size
  self.seed = opts.seed or 0
  self.sampler = Sampler.new({ n = self.num_sequences, batch_size = opts.batch_size, seed = self.seed,
    shuffle = opts.shuffle, rank = opts.rank, world_size = opts.world_size,
    name = ('fsdp.data.tokens: %s (%s split, %d tokens = %d sequences of %d)'):format(
      path, split, total, self.num_sequences, self.seq_len) })
  return self
end

-- Copy tokens [pos, pos + len) of the stream into dst (a 1-d i64 view).
function Dataset:_copy(dst, pos, len)
  local k = 1
  while k < #self.starts and self.starts[k + 1] <= pos do k = k + 1 end
  local done = 0
  while done < len do
    local s = self.shards[k]
    local off = pos + done - self.starts[k]
    local m = math.min(len - done, s.n - off)
    dst:narrow(0, done, m):copy_(s.tokens:narrow(0, off, m))
    done, k = done + m, k + 1
  end
end

-- The batch of the given sequence ids: ids, targets i64 [#seqs, T].
function Dataset:gather(seqs)
  local T = self.seq_len
  local rows = fsdp.empty({ #seqs, T + 1 }, { dtype = 'i64' })
  for b, i in ipairs(seqs) do self:_copy(rows:select(0, b - 1), i * T, T + 1) end
  local top = rows:max():item()
  if top >= self.vocab_size then
    fail('%s holds token id %d, outside its vocabulary of %d (corrupt shard?)', self.path, top, self.vocab_size)
  end
  return rows:narrow(1, 0, T):contiguous(), rows:narrow(1, 1, T):contiguous()
end

-- This rank's next training batch: ids, targets i64 [batch_size, seq_len].
function Dataset:next()
  return self:gather((self.sampler:next()))
end

function Dataset:epoch() return self.sampler.epoch end
function Dataset:steps_per_epoch() return self.sampler.steps_per_epoch end

-- The first n global batches in order, this rank's part of each (for
-- validation: every evaluation sees the same sequences). n is capped at
-- the batches the split holds.
function Dataset:batches(n) return self.sampler:gather_batches(self, n) end

-- The data position, a plain table (stored in checkpoints), with the
-- shards' fingerprint (see the top).
function Dataset:state()
  local s = self.sampler:state()
  local st = { kind = 'tokens', epoch = s.epoch, position = s.position, seed = self.seed,
               seq_len = self.seq_len, num_sequences = self.num_sequences, num_shards = #self._paths,
               shards_digest = self._digest }
  if self.sampler.rank == 0 then
    if not self._listing then
      local l = {}
      for i, p in ipairs(self._paths) do l[i] = { p, self._sizes[i], self._prints[i] } end
      self._listing = l
    end
    st.shards = self._listing
  end
  return st
end

function Dataset:load_state(s)
  if type(s) ~= 'table' or s.kind ~= 'tokens' then
    fail('%s: load_state expects a state from a token dataset, got %s', self.path, changes.describe(s))
  end
  local found = {}
  if s.shards_digest == nil then
    console.print_all(('data: %s: the saved position has no fingerprint (saved by an '
      .. 'older fsdp-lua): resuming without checking the shards'):format(self.path))
  elseif s.shards ~= nil and not changes.valid_listing(s.shards) then
    fail('%s: the saved position\'s list of shards is damaged', self.path)
  elseif s.shards_digest ~= self._digest then
    if s.shards then
      found = changes.listing(s.shards, self._paths, self._sizes, self._prints, false)
    end
    if #found == 0 then
      found[1] = { file = self.path, refuse = true, what = ('its shards changed since the data position was saved '
        .. '(%s then, %d now: added, removed or rewritten; rank 0\'s position names them)'):format(
        changes.describe(s.num_shards), #self._paths) }
    end
  end
  changes.refuse(self.data_changed, found)
  local resized = s.num_sequences ~= self.num_sequences and #found > 0 and s.seq_len == self.seq_len
    and s.seed == self.seed and type(s.position) == 'number'
  if (s.seq_len ~= self.seq_len or s.num_sequences ~= self.num_sequences or s.seed ~= self.seed) and not resized then
    fail('%s: the saved position is for %s sequences of %s tokens with seed %s; this dataset has %d of %d '
      .. 'with seed %d (different data or options)', self.path, changes.describe(s.num_sequences),
      changes.describe(s.seq_len), changes.describe(s.seed), self.num_sequences, self.seq_len, self.seed)
  end
  changes.apply(self.data_changed, found)
  if resized then
    -- going on over other data: the same epoch, at most its new length in
    local gb = self.sampler.global_batch
    local last = self.sampler.steps_per_epoch * gb
    s = { epoch = s.epoch, position = math.min(s.position - s.position % gb, last) }
  end
  self.sampler:load_state(s)
end

function Dataset:__tostring()
  return ('TokenDataset(%s, %s: %d shards, %d tokens, %s, vocab %d, eos %d, %d sequences of %d)'):format(
    self.path, self.split, #self.shards, self.num_tokens, self.shards[1].dtype, self.vocab_size, self.eos_id,
    self.num_sequences, self.seq_len)
end

return M
