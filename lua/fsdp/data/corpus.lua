-- fsdp.data.corpus: raw corpora (.txt, .jsonl, .json, each optionally .gz
-- or .zst; a file, a directory or a glob) read by the core's readers
-- (core/data/reader.c), and streamed into training rows by the core's
-- loader (core/data/stream.c): no preparation step, tokenization ahead in
-- worker threads.
--
--   local corpus = require 'fsdp.data.corpus'
--   for text, pos in corpus.documents('c4/en/*.json.gz') do ... end   -- pos: {path, offset, index, line}
--   local train = corpus.open('c4/en/*.json.gz', { tokenizer = tok, seq_len = 512, batch_size = 4,
--                                                  split = 'train', seed = 0 })
--   local ids, targets = train:next()          -- i64 [4, 512] each, targets = ids shifted by one
--   local st = train:state()                   -- a plain table for the checkpoint
--   train:load_state(st)                       -- continues with exactly the next batch
--   for ids, targets in val:batches(8) do ... end   -- the first 8 batches (validation)
--
-- A document is a paragraph of a .txt file (lines up to a blank line) or
-- the text_field of a JSON line. The train split holds the documents that
-- validation does not: with val_fraction f, document k of each file goes to
-- validation when floor((k+1)f) > floor(kf) (tools/tokenize.lua's rule).
-- opts.tokenizer is a tokenizer object (fsdp.data.tokenizer) with
-- vocab_size, eos_id and c_hook(), which returns the fl_tokenizer_hook its
-- worker threads call ([Note: the tokenizer hook] in core/include/fsdp.h).
local ffi = require 'ffi'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local fsdp = require 'fsdp'
local C = core.C

local M = {}

local function fail(fmt, ...) core.fail('fsdp.data.corpus: ' .. fmt:format(...)) end

-- The files of a corpus path (file, directory or glob), sorted.
function M.files(spec)
  local l = C.fl_file_list_open(spec)
  if l == nil then core.raise() end
  local out = {}
  for i = 0, tonumber(C.fl_file_list_count(l)) - 1 do out[#out + 1] = ffi.string(C.fl_file_list_path(l, i)) end
  C.fl_file_list_free(l)
  return out
end

local function reader_opts(opts)
  local ro = ffi.new('fl_reader_opts')
  ro.text_field = opts.text_field or 'text'
  ro.max_doc_bytes = opts.max_doc_bytes or 0
  return ro
end

-- Iterate the documents of a corpus path: text, {path, offset, index, line}.
-- opts: text_field ('text'), max_doc_bytes (8 MiB). Errors name the file
-- and the line or byte.
function M.documents(spec, opts)
  opts = opts or {}
  local paths = M.files(spec)
  local ro = reader_opts(opts)
  local field = opts.text_field or 'text' -- kept alive with ro.text_field
  local k, r = 0, nil
  local text, len, pos = ffi.new('const char *[1]'), ffi.new('size_t[1]'), ffi.new('fl_doc_position')
  return function()
    local _ = field
    while true do
      if r == nil then
        k = k + 1
        if k > #paths then return nil end
        r = ffi.gc(C.fl_reader_open(paths[k], ro), C.fl_reader_free)
        if r == nil then core.raise() end
      end
      local rc = C.fl_reader_next(r, text, len)
      if rc < 0 then core.raise() end
      if rc == 1 then
        C.fl_reader_position(r, pos)
        return ffi.string(text[0], len[0]), { path = paths[k], offset = tonumber(pos.offset),
          index = tonumber(pos.index), line = tonumber(pos.line) }
      end
      C.fl_reader_free(ffi.gc(r, nil))
      r = nil
    end
  end
end

local SPLITS = { all = C.FL_SPLIT_ALL, train = C.FL_SPLIT_TRAIN, val = C.FL_SPLIT_VAL }

local Stream = {}
Stream.__index = Stream
M.Stream = Stream

-- Open a stream. opts: tokenizer (required), seq_len, batch_size (per
-- rank), split ('all', 'train' or 'val'), val_fraction (0.01), seed (0),
-- shuffle (true), threads (2), text_field, max_doc_bytes, rank/world_size
-- (default: fsdp.dist's), once (one pass, for validation), read_all (every
-- rank reads the whole split and batches() gives each its part: for
-- validation, where every rank must see the same number of batches).
function M.open(spec, opts)
  opts = opts or {}
  local tok = opts.tokenizer
  if type(tok) ~= 'table' or type(tok.c_hook) ~= 'function' then
    fail('open %s: opts.tokenizer must be a tokenizer with c_hook() (got %s)', tostring(spec),
      type(tok) == 'table' and tostring(tok.name or tok) or tostring(tok))
  end
  if not tok.eos_id then fail('open %s: the tokenizer %s has no end-of-text token', tostring(spec), tostring(tok)) end
  local T, B = opts.seq_len, opts.batch_size
  if validate.problem(T, validate.COUNT) then fail('open %s: seq_len must be an integer >= 1', spec) end
  if validate.problem(B, validate.COUNT) then fail('open %s: batch_size must be an integer >= 1', spec) end
  local split = opts.split or 'all'
  if not SPLITS[split] then fail('open %s: split must be all, train or val, got %s', spec, tostring(split)) end
  local dist = require 'fsdp.dist'
  local rank = opts.rank or dist.rank()
  local world = opts.world_size or dist.world_size()
  local read_rank, read_world = rank, world
  if opts.read_all then read_rank, read_world = 0, 1 end
  local o = ffi.new('fl_stream_opts')
  local keep = { spec = spec, field = opts.text_field or 'text' }
  o.path = keep.spec
  o.reader.text_field = keep.field
  o.reader.max_doc_bytes = opts.max_doc_bytes or 0
  o.tokenizer = tok:c_hook()
  o.eos_id, o.vocab_size = tok.eos_id, opts.vocab_size or tok.vocab_size
  o.seq_len = T
  o.seed = opts.seed or 0
  o.shuffle = opts.shuffle ~= false
  o.once = opts.once and true or false
  o.rank, o.world_size = read_rank, read_world
  o.threads = opts.threads or 2
  o.split = SPLITS[split]
  o.val_fraction = opts.val_fraction or (split == 'all' and 0 or 0.01)
  o.ahead_tokens = opts.ahead_tokens or 0
  local s = C.fl_stream_open(o)
  if s == nil then core.raise() end
  local self = setmetatable({ _s = ffi.gc(s, C.fl_stream_free), _keep = keep, path = spec, split = split,
    seq_len = T, batch_size = B, seed = tonumber(o.seed), rank = rank, world_size = world,
    vocab_size = tonumber(o.vocab_size), eos_id = tok.eos_id, tokenizer = tok.name or 'unknown',
    val_fraction = o.val_fraction, threads = o.threads, text_field = keep.field, once = o.once,
    tokenizer_object = tok, read_all = opts.read_all and true or false,
    num_files = #M.files(spec), _st = ffi.new('fl_stream_state') }, Stream)
  return self
end

-- Up to n rows of seq_len + 1 tokens (an i64 [k, seq_len + 1] tensor,
-- k < n only at the end of a `once` stream; nil when k = 0).
function Stream:rows(n)
  local t = fsdp.empty({ n, self.seq_len + 1 }, { dtype = 'i64' })
  local k = tonumber(C.fl_stream_next(self._s, n, ffi.cast('int64_t *', t._c.data)))
  if k < 0 then core.raise() end
  if k == 0 then return nil end
  if k < n then t = t:narrow(0, 0, k) end
  return t
end

local function split_rows(rows, T)
  return rows:narrow(1, 0, T):contiguous(), rows:narrow(1, 1, T):contiguous()
end

-- This rank's next training batch: ids, targets i64 [batch_size, seq_len].
function Stream:next()
  local rows = self:rows(self.batch_size)
  if rows == nil or rows:size(0) < self.batch_size then
    fail('%s: the %s split ended (a one-pass stream) before a whole batch', self.path, self.split)
  end
  return split_rows(rows, self.seq_len)
end

-- An epoch is one pass over the rank's files; the stream has no fixed
-- number of steps in one.
function Stream:epoch()
  self._st = self._st or ffi.new('fl_stream_state')
  C.fl_stream_get_state(self._s, self._st)
  return math.floor(tonumber(self._st.file) / tonumber(C.fl_stream_files_per_epoch(self._s)))
end
function Stream:steps_per_epoch() return nil end

-- The first n global batches from the start of the stream, this rank's
-- part of each (rows rank * batch_size ...): every evaluation sees the
-- same sequences. The stream is read from its start (its position is kept
-- and restored). A split with fewer rows gives fewer batches; `count`
-- says how many there are (for the warning about a tiny split). A `once`
-- stream keeps the batches it read (validation reads the same ones again).
function Stream:batches(n)
  local out = self._batches
  if not (out and out.n >= n) then out = self:_read_batches(n) end
  if self.once then self._batches = out end
  local i = 0
  return function()
    i = i + 1
    if i <= n and out[i] then return split_rows(out[i], self.seq_len) end
  end, math.min(n, #out)
end

function Stream:_read_batches(n)
  local saved = self:state()
  self:load_state(self:_start_state())
  local G = self.batch_size * self.world_size
  local out = {}
  for _ = 1, n do
    local rows = self:rows(G)
    if rows == nil or rows:size(0) < G then break end
    out[#out + 1] = rows:narrow(0, self.rank * self.batch_size, self.batch_size)
  end
  out.n = n
  self:load_state(saved)
  return out
end

-- How many global batches (of batch_size x world_size rows) the split
-- holds, up to `limit`: 0 for an empty split.
function Stream:count_batches(limit)
  local _, n = self:batches(limit)
  return n
end

function Stream:_start_state()
  return { kind = 'stream', file = 0, offset = 0, index = 0, line = 1, consumed = 0, carry = -1,
           path = self.path, split = self.split, seed = self.seed, seq_len = self.seq_len,
           rank = self.rank, world_size = self.world_size, tokenizer = self.tokenizer,
           vocab_size = self.vocab_size, file_name = self:file_name(0) }
end

function Stream:file_name(file)
  local p = C.fl_stream_file_path(self._s, file)
  return p ~= nil and ffi.string(p) or nil
end

-- The position, a plain table (stored in checkpoints: each rank its own).
function Stream:state()
  local st = self._st
  C.fl_stream_get_state(self._s, st)
  local s = self:_start_state()
  s.file, s.offset, s.index, s.line = tonumber(st.file), tonumber(st.doc.offset), tonumber(st.doc.index),
    tonumber(st.doc.line)
  s.consumed, s.carry = tonumber(st.consumed), tonumber(st.carry)
  s.file_name = self:file_name(st.file)
  s.epoch = math.floor(s.file / tonumber(C.fl_stream_files_per_epoch(self._s)))
  return s
end

function Stream:load_state(s)
  if type(s) ~= 'table' or s.kind ~= 'stream' then
    fail('%s: load_state expects a state from a corpus stream, got %s', self.path,
      type(s) == 'table' and ('kind ' .. tostring(s.kind)) or tostring(s))
  end
  for _, k in ipairs({ 'split', 'seed', 'seq_len', 'rank', 'world_size', 'tokenizer', 'vocab_size' }) do
    if s[k] ~= self[k] then
      fail('%s: the saved position is for %s = %s, this stream has %s (resume with the same data options, '
        .. 'tokenizer and number of ranks)', self.path, k, tostring(s[k]), tostring(self[k]))
    end
  end
  local name = self:file_name(s.file)
  if name ~= s.file_name then
    fail('%s: the saved position is in %s, but this corpus has %s there (files added, removed or renamed?)',
      self.path, tostring(s.file_name), tostring(name))
  end
  local st = ffi.new('fl_stream_state')
  st.file, st.doc.offset, st.doc.index, st.doc.line = s.file, s.offset, s.index, s.line
  st.consumed, st.carry = s.consumed, s.carry
  core.check(C.fl_stream_set_state(self._s, st))
end

function Stream:__tostring()
  return ('CorpusStream(%s, %s: %d files, %s, %d threads, rows of %d)'):format(self.path, self.split,
    self.num_files, self.tokenizer, self.threads, self.seq_len + 1)
end

return M
