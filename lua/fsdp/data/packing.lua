-- fsdp.data.packing: several short tokenized examples per training
-- sequence (packed sequences), so that a batch of variable-length examples
-- spends its compute on tokens rather than on padding.
--
--   local packing = require 'fsdp.data.packing'
--   local packer = packing.new(examples, { seq_len = 512, batch_size = 8 })
--   for batch in packer:batches() do          -- or packer:next() until nil
--     local loss = model:loss(batch.ids, batch.targets,
--                             { positions = batch.positions, segments = batch.segments })
--   end
--   print(packer:stats().fraction)            -- real tokens over all slots
--
-- examples: an array of examples, or a function returning the next one
-- (nil at the end). An example is {ids = i64 [L] tensor or array of ids,
-- labels = the same length or nil}: labels aligned with ids as Hugging
-- Face's (labels[t] is the token at t or -100 where it is not trained, e.g.
-- the prompt); nil trains on every token. An example may give targets
-- instead (labels already shifted by one, -100 at its last token: what
-- model:loss takes, as fsdp.data.chat_batches holds them).
--
-- A batch: ids, targets, positions, segments, all i64 [batch_size, seq_len]:
--   targets    the labels shifted by one (what model:loss takes): the target
--              at t is labels[t + 1] of the same example, and -100 at an
--              example's last token, so nothing is predicted across a
--              boundary; -100 in the padding
--   positions  0, 1, ... restarting at every example (RoPE by positions);
--              0 in the padding
--   segments   the example's index within its row (0, 1, ...), -1 for
--              padding: nn.Attention confines each query to its own example
--              ([Note: packed sequences] in core/ops/attention.c)
-- and n_examples (the examples, or pieces of split ones, in it), tokens (real
-- tokens) and fraction (tokens / (batch_size * seq_len)). ids are pad_id (0)
-- in the padding.
--
-- opts:
--   seq_len, batch_size  the batch's shape (required)
--   strategy  'ffd' (default): first-fit decreasing within a buffer of the
--             next `buffer` examples (256): the longest first, each into the
--             first row with room, examples that fit nowhere waiting for the
--             next batch. It reorders examples (within the buffer only) and
--             fills rows far better than taking them in order.
--             'greedy': in order, each into the current row or, when it does
--             not fit, the next (next-fit; no reordering).
--             'pad': one example per row (the unpacked baseline, with the same
--             batch fields).
--   overflow  what an example longer than seq_len becomes: 'truncate'
--             (default: its first seq_len tokens; TRL's max_length does the
--             same), 'split' (pieces of seq_len, each its own document: later
--             pieces lose the context of earlier ones), 'error'.
--   pad_id    the id of padding tokens (0; the loss ignores them anyway).
--
-- The fraction of real tokens is each batch's `fraction` and the stats'
-- (examples, pieces, truncated, split, dropped_tokens, batches, tokens,
-- slots, fraction). Per-token work is tensor copies of whole examples.
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'

local M = {}

local function fail(fmt, ...) core.fail('fsdp.data.packing: ' .. fmt:format(...)) end

local STRATEGIES = { ffd = true, greedy = true, pad = true }
local OVERFLOWS = { truncate = true, split = true, error = true }

local Packer = {}
Packer.__index = Packer

-- An example's field as a 1-d i64 tensor.
local function ids_tensor(v, what, n)
  if type(v) == 'table' and not fsdp.is_tensor(v) then
    if #v == 0 then fail('example %d: %s is empty', n, what) end
    return fsdp.tensor(v, { dtype = 'i64' })
  end
  if not fsdp.is_tensor(v) then fail('example %d: %s must be a tensor or an array of ids, got %s', n, what, type(v)) end
  if v.ndim ~= 1 then fail('example %d: %s must be 1-d, got shape %s', n, what, validate.show(v.shape)) end
  if v.dtype ~= 'i64' and v.dtype ~= 'i32' then fail('example %d: %s must be i64 or i32, got %s', n, what, v.dtype) end
  if v:numel() == 0 then fail('example %d: %s is empty', n, what) end
  return v.device == 'cpu' and v or v:to('cpu')
end

function M.new(source, opts)
  opts = opts or {}
  local T, B = opts.seq_len, opts.batch_size
  if validate.problem(T, { min = 1, int = true }) then
    fail('seq_len must be a positive integer, got %s', validate.show(T))
  end
  if validate.problem(B, { min = 1, int = true }) then
    fail('batch_size must be a positive integer, got %s', validate.show(B))
  end
  local strategy, overflow = opts.strategy or 'ffd', opts.overflow or 'truncate'
  if not STRATEGIES[strategy] then
    fail("strategy must be 'ffd', 'greedy' or 'pad', got %s", validate.show(strategy))
  end
  if not OVERFLOWS[overflow] then
    fail("overflow must be 'truncate', 'split' or 'error', got %s", validate.show(overflow))
  end
  local buffer = opts.buffer or 256
  if validate.problem(buffer, { min = 1, int = true }) then
    fail('buffer must be a positive integer, got %s', validate.show(opts.buffer))
  end
  local next_example
  if type(source) == 'function' then
    next_example = source
  elseif type(source) == 'table' then
    local i = 0
    next_example = function() i = i + 1; return source[i] end
  else
    fail('examples must be an array or a function returning the next example, got %s', type(source))
  end
  local self = setmetatable({ T = T, B = B, strategy = strategy, overflow = overflow, buffer = buffer,
                              pad_id = opts.pad_id or 0, next_example = next_example, queue = {}, done = false,
                              arange = fsdp.arange(T, { dtype = 'i64' }),
                              counts = { examples = 0, pieces = 0, truncated = 0, split = 0, dropped_tokens = 0,
                                         batches = 0, tokens = 0, slots = 0 } }, Packer)
  return self
end

-- The next example as pieces of at most T tokens queued: {ids, targets, n}.
function Packer:pull()
  local ex = self.next_example()
  if ex == nil then
    self.done = true
    return
  end
  local c = self.counts
  c.examples = c.examples + 1
  local n = c.examples
  if type(ex) ~= 'table' or fsdp.is_tensor(ex) then
    fail('example %d must be a table {ids =, labels =}, got %s', n, type(ex))
  end
  local ids = ids_tensor(ex.ids, 'ids', n)
  local L = ids:numel()
  local targets
  if ex.targets ~= nil then
    if ex.labels ~= nil then fail('example %d gives both labels and targets', n) end
    targets = ids_tensor(ex.targets, 'targets', n)
    if targets:numel() ~= L then fail('example %d: %d targets for %d ids', n, targets:numel(), L) end
    if targets:get(L - 1) ~= -100 then
      fail('example %d: its targets predict past its last token (the last must be -100)', n)
    end
  else
    local labels = ex.labels ~= nil and ids_tensor(ex.labels, 'labels', n) or ids
    if labels:numel() ~= L then fail('example %d: %d labels for %d ids', n, labels:numel(), L) end
    -- the targets of the whole example: labels shifted by one, -100 at its end
    targets = fsdp.full({ L }, -100, { dtype = 'i64' })
    if L > 1 then targets:narrow(0, 0, L - 1):copy_(labels:narrow(0, 1, L - 1)) end
  end
  local T = self.T
  if L > T then
    if self.overflow == 'error' then fail('example %d has %d tokens, more than seq_len %d', n, L, T) end
    if self.overflow == 'truncate' then
      c.truncated = c.truncated + 1
      c.dropped_tokens = c.dropped_tokens + L - T
      L = T
    else
      c.split = c.split + 1
    end
  end
  for s = 0, L - 1, T do
    local len = math.min(T, L - s)
    self.queue[#self.queue + 1] = { ids = ids:narrow(0, s, len), targets = targets:narrow(0, s, len), n = len }
    c.pieces = c.pieces + 1
  end
end

-- Queue at least `want` pieces (fewer at the end of the source).
function Packer:fill(want)
  while #self.queue < want and not self.done do self:pull() end
end

-- Rows of placements {piece, row, offset}: which queued pieces go into the
-- next batch; the others stay queued in order.
function Packer:place()
  local T, B, q = self.T, self.B, self.queue
  local placed, used, rest = {}, {}, {}
  for r = 1, B do used[r] = 0 end
  if self.strategy == 'ffd' then
    self:fill(self.buffer)
    local order = {}
    for i = 1, #q do order[i] = i end
    table.sort(order, function(a, b) if q[a].n ~= q[b].n then return q[a].n > q[b].n end return a < b end)
    local taken = {}
    for _, i in ipairs(order) do
      for r = 1, B do
        if T - used[r] >= q[i].n then
          placed[#placed + 1] = { piece = q[i], row = r, offset = used[r] }
          used[r] = used[r] + q[i].n
          taken[i] = true
          break
        end
      end
    end
    for i = 1, #q do if not taken[i] then rest[#rest + 1] = q[i] end end
  else
    local r, i = 1, 1
    while r <= B do
      self:fill(i)
      local p = q[i]
      if p == nil then break end
      if self.strategy == 'pad' and used[r] > 0 or T - used[r] < p.n then
        r = r + 1
      else
        placed[#placed + 1] = { piece = p, row = r, offset = used[r] }
        used[r] = used[r] + p.n
        i = i + 1
      end
    end
    for k = i, #q do rest[#rest + 1] = q[k] end
  end
  self.queue = rest
  return placed
end

-- The next batch (see the top), or nil when every example was packed.
function Packer:next()
  self:fill(1)
  if #self.queue == 0 then return nil end
  local T, B = self.T, self.B
  local placed = self:place()
  local ids = fsdp.full({ B, T }, self.pad_id, { dtype = 'i64' })
  local targets = fsdp.full({ B, T }, -100, { dtype = 'i64' })
  local positions = fsdp.zeros({ B, T }, { dtype = 'i64' })
  local segments = fsdp.full({ B, T }, -1, { dtype = 'i64' })
  local docs, tokens = {}, 0
  for _, pl in ipairs(placed) do
    local p, r, o = pl.piece, pl.row - 1, pl.offset
    docs[r] = (docs[r] or -1) + 1
    ids:select(0, r):narrow(0, o, p.n):copy_(p.ids)
    targets:select(0, r):narrow(0, o, p.n):copy_(p.targets)
    positions:select(0, r):narrow(0, o, p.n):copy_(self.arange:narrow(0, 0, p.n))
    segments:select(0, r):narrow(0, o, p.n):fill_(docs[r])
    tokens = tokens + p.n
  end
  local c = self.counts
  c.batches, c.tokens, c.slots = c.batches + 1, c.tokens + tokens, c.slots + B * T
  return { ids = ids, targets = targets, positions = positions, segments = segments, n_examples = #placed,
           tokens = tokens, fraction = tokens / (B * T) }
end

-- An iterator over the remaining batches.
function Packer:batches()
  return function() return self:next() end
end

-- Counts so far: examples read, pieces (after splitting), truncated and
-- split examples, dropped_tokens (cut by truncation), batches, tokens
-- (real), slots (batch_size * seq_len per batch) and fraction = tokens /
-- slots.
function Packer:stats()
  local s = {}
  for k, v in pairs(self.counts) do s[k] = v end
  s.fraction = s.slots > 0 and s.tokens / s.slots or 0
  return s
end

return M
