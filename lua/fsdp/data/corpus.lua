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
--
-- [Note: the fingerprint of a data position]
-- A saved position is only worth what the files still are: a file cut
-- below it, edited where it was read, or a file added or removed (which
-- changes every epoch's order and which rank reads what) would make a
-- resumed run read something else, silently, or fail blaming a line that
-- is valid as written. So the position carries the fingerprint of what it
-- stands on, and load_state compares it with the files now:
--   * the file being read: XXH3-64 of its bytes before the document at the
--     position (`before`) and through that document's last line
--     (`through`). The reader hashes every byte as it takes it from its
--     window (core/data/reader.c), so a position costs a digest, not a
--     pass over the data, however long the run; checking it at resume
--     reads that file up to the position once, in the thread that resumes
--     (a compressed file had to be decompressed that far anyway), and that
--     reader is the one the stream goes on with. Of a .gz or .zst file the
--     decompressed bytes are hashed: the offset is counted in them, and a
--     document boundary falls inside a compressed block, where no prefix
--     of the compressed bytes ends.
--   * every file of the corpus: its name and size as stored (compressed)
--     when the stream opened (fl_file_list: one stat each), so a file not
--     being read is seen too: cut, replaced by a smaller one, compressed
--     again smaller (the same text, but nothing short of reading it all
--     tells that), added or removed. Rank 0's position holds the list
--     ({name, size} each: one copy per checkpoint, however many ranks);
--     every rank's holds the count and a digest of the names, so any rank
--     sees a file added, removed or renamed, and rank 0 names it. A file
--     smaller than it was is refused; a larger one is taken as appended to
--     (a log that grows is a real corpus): the position is checked byte for
--     byte up to where it is, and what was appended is read when the
--     stream gets there.
-- What is not seen: a file edited in place, keeping its size, anywhere but
-- in the file being read up to the position (already read files, files
-- not read yet): seeing that would mean reading them all again at every
-- resume. A position saved before fingerprints is resumed as it is, said.
-- What a difference does is the source's data_changed (--data_changed):
-- stop (the default) refuses in one line naming the file, continue says
-- each change and goes on as near the position as the data allows
-- (fsdp.data.changes). Token shards (fsdp.data.tokens) and text pairs
-- (fsdp.data.pairs) record their files the same way.
local ffi = require 'ffi'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local factories = require 'fsdp.factories'
local changes = require 'fsdp.data.changes'
local console = require 'fsdp.observe.console'
local dist = require 'fsdp.dist'
local mesh = require 'fsdp.mesh'
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
-- validation, where every rank must see the same number of batches),
-- data_changed ('stop' or 'continue': what load_state does with a position
-- whose files changed; see the Note).
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
  -- the data-parallel ranks ([Note: data-parallel rank and size] in fsdp/mesh.lua)
  local rank = opts.rank or mesh.data_parallel_rank()
  local world = opts.world_size or mesh.data_parallel_size()
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
  local data_changed = changes.policy(opts.data_changed, 'fsdp.data.corpus: open ' .. tostring(spec))
  local s = C.fl_stream_open(o)
  if s == nil then core.raise() end
  -- the files as listed at open, with their sizes (the Note)
  local list = C.fl_stream_files(s)
  local names, sizes = {}, {}
  for i = 0, tonumber(C.fl_file_list_count(list)) - 1 do
    names[#names + 1] = ffi.string(C.fl_file_list_path(list, i))
    sizes[#sizes + 1] = tonumber(C.fl_file_list_size(list, i))
  end
  local self = setmetatable({ _s = ffi.gc(s, C.fl_stream_free), _keep = keep, path = spec, split = split,
    seq_len = T, batch_size = B, seed = tonumber(o.seed), rank = rank, world_size = world,
    vocab_size = tonumber(o.vocab_size), eos_id = tok.eos_id, tokenizer = tok.name or 'unknown',
    val_fraction = o.val_fraction, threads = o.threads, text_field = keep.field, once = o.once,
    tokenizer_object = tok, read_all = opts.read_all and true or false, data_changed = data_changed,
    num_files = #names, _names = names, _sizes = sizes, _names_digest = changes.hash(table.concat(names, '\n')),
    _st = ffi.new('fl_stream_state') }, Stream)
  return self
end

-- Up to n rows of seq_len + 1 tokens (an i64 [k, seq_len + 1] tensor,
-- k < n only at the end of a `once` stream; nil when k = 0).
function Stream:rows(n)
  local t = factories.empty({ n, self.seq_len + 1 }, { dtype = 'i64' })
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
  assert(self:_seek(self:_start_state(), false))
  local G = self.batch_size * self.world_size
  local out = {}
  for _ = 1, n do
    local rows = self:rows(G)
    if rows == nil or rows:size(0) < G then break end
    out[#out + 1] = rows:narrow(0, self.rank * self.batch_size, self.batch_size)
  end
  out.n = n
  assert(self:_seek(saved, false))
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

-- The position, a plain table (stored in checkpoints: each rank its own),
-- with the fingerprint of the data it stands on (the Note).
function Stream:state()
  local st = self._st
  C.fl_stream_get_state(self._s, st)
  local s = self:_start_state()
  s.file, s.offset, s.index, s.line = tonumber(st.file), tonumber(st.doc.offset), tonumber(st.doc.index),
    tonumber(st.doc.line)
  s.consumed, s.carry = tonumber(st.consumed), tonumber(st.carry)
  s.file_name = self:file_name(st.file)
  s.epoch = math.floor(s.file / tonumber(C.fl_stream_files_per_epoch(self._s)))
  s.before, s.through = changes.hex(st.doc.before), changes.hex(st.doc.through)
  s.num_files, s.names_digest = self.num_files, self._names_digest
  if self.rank == 0 then
    if not self._listing then
      local l = {}
      for i, name in ipairs(self._names) do l[i] = { name, self._sizes[i] } end
      self._listing = l
    end
    s.files = self._listing
  end
  return s
end

-- A number a position may hold: an integer from lo up to 2^53.
local function whole(v, lo)
  return type(v) == 'number' and v == math.floor(v) and v >= lo and v <= 2 ^ 53
end

-- Move the stream to position s (checked: the fingerprint must hold);
-- false and the core's message when the check fails.
function Stream:_seek(s, check)
  local st = ffi.new('fl_stream_state')
  st.file, st.doc.offset, st.doc.index, st.doc.line = s.file, s.offset, s.index, s.line
  st.consumed, st.carry = s.consumed, s.carry
  if check then st.doc.before, st.doc.through = changes.u64(s.before), changes.u64(s.through) end
  if C.fl_stream_set_state(self._s, st, check) ~= 0 then return false, core.last_error() end
  return true
end

-- Continue from a position state() gave. The data is compared with the
-- fingerprint the position carries (the Note): with data_changed = 'stop'
-- a change is an error naming the file, before the stream moves; with
-- 'continue' each change is said and the stream goes on as near the
-- position as the data allows. Returns nothing.
function Stream:load_state(s)
  if type(s) ~= 'table' or s.kind ~= 'stream' then
    fail('%s: load_state expects a state from a corpus stream, got %s', self.path, changes.describe(s))
  end
  for _, k in ipairs({ 'split', 'seed', 'seq_len', 'rank', 'world_size', 'tokenizer', 'vocab_size' }) do
    if s[k] ~= self[k] then
      fail('%s: the saved position is for %s = %s, this stream has %s (resume with the same data options, '
        .. 'tokenizer and number of ranks)', self.path, k, changes.describe(s[k]), tostring(self[k]))
    end
  end
  for _, k in ipairs({ 'file', 'offset', 'index', 'line', 'consumed', 'carry' }) do
    local lo = (k == 'line' and 1) or (k == 'carry' and -1) or 0
    if not whole(s[k], lo) then
      fail('%s: the saved position has %s = %s, not an integer from %d (a damaged position)', self.path, k,
        changes.describe(s[k]), lo)
    end
  end
  if type(s.file_name) ~= 'string' then
    fail('%s: the saved position names no file (file_name = %s: a damaged position)', self.path,
      changes.describe(s.file_name))
  end
  local fingerprinted = s.names_digest ~= nil or s.before ~= nil
  if fingerprinted and (type(s.names_digest) ~= 'string' or not whole(s.num_files, 1) or not changes.u64(s.before)
      or not changes.u64(s.through) or (s.files ~= nil and not changes.valid_listing(s.files))) then
    fail('%s: the saved position\'s fingerprint is damaged (num_files %s, names_digest %s, before %s, through %s, '
      .. 'files %s)', self.path, changes.describe(s.num_files), changes.describe(s.names_digest),
      changes.describe(s.before), changes.describe(s.through), type(s.files))
  end
  if not fingerprinted then
    -- a position saved before fingerprints: nothing to compare
    console.print_all(('data: %s: the saved position has no fingerprint (saved by an '
      .. 'older fsdp-lua): resuming without checking the files'):format(self.path))
    local name = self:file_name(s.file)
    if name ~= s.file_name then
      fail('%s: the saved position is in %s, but this corpus has %s there (files added, removed or renamed?)',
        self.path, changes.name(s.file_name), tostring(name))
    end
    local ok, err = self:_seek(s, false)
    if not ok then core.fail(err) end
    return
  end
  local found = {}
  if s.files then
    found = changes.listing(s.files, self._names, self._sizes, nil, true)
  elseif s.num_files ~= self.num_files or s.names_digest ~= self._names_digest then
    found[1] = { file = self.path, refuse = true, what = ('its files changed since the data position was saved '
      .. '(%d then, %d now: added, removed or renamed; rank 0\'s position names them)'):format(s.num_files,
      self.num_files) }
  end
  local name = self:file_name(s.file)
  if name ~= s.file_name and #found == 0 then
    found[1] = { file = s.file_name, refuse = true, what = ('no longer at place %d of the file order '
      .. '(%s is there now)'):format(s.file, tostring(name)) }
  end
  -- under stop a changed listing is refused before any file is read
  changes.refuse(self.data_changed, found)
  local here = s
  if name ~= s.file_name then
    -- the order moved: the file the position is in is elsewhere now (or
    -- gone); going on, the file now at this place is read from its start
    here = { file = s.file, offset = 0, index = 0, line = 1, consumed = 0, carry = s.carry }
  else
    local ok, err = self:_seek(s, true)
    if ok then
      changes.apply(self.data_changed, found)
      return
    end
    local plain = tostring(name):gsub('%p', '%%%0')
    local what = err:match('^' .. plain .. ': (.*)$')
    if not what then core.fail(err) end -- not about the data (out of memory, a bad position)
    found[#found + 1] = { file = name, refuse = true, what = what }
  end
  changes.apply(self.data_changed, found)
  local ok, err = self:_seek(here, false)
  if not ok then core.fail(err) end
end

function Stream:__tostring()
  return ('CorpusStream(%s, %s: %d files, %s, %d threads, rows of %d)'):format(self.path, self.split,
    self.num_files, self.tokenizer, self.threads, self.seq_len + 1)
end

return M
