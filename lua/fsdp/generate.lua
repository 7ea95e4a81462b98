-- fsdp.generate: text generation for causal language models (Llama, GPT-2)
-- with a preallocated KV cache, and the token choice every decoder shares
-- (T5's generate uses the same sampler).
--
--   local generate = require 'fsdp.generate'
--   local rows = generate.generate(model, { {1, 5, 9}, {7, 3} }, {
--     max_new_tokens = 32, do_sample = true, temperature = 0.8, top_k = 50, top_p = 0.95,
--     repetition_penalty = 1.1, stop_ids = {2}, pad_id = 0, seed = 0,
--     on_token = function(step, tokens, done) ... end })   -- tokens: {row -> id} this step
--   -- rows[b]: the new ids of prompt b (ending with its stop id, if one came)
--
-- kv_cache_spec() may give max_positions (no prompt plus new tokens past
-- it), extrapolates (past it only with allow_past_max_positions: Llama's
-- RoPE; GPT-2's position table has no row past it) and windows (each
-- layer's sliding window or false: a sliding layer's cache is a ring of
-- its window).
-- The model is one with kv_cache_spec() and forward(ids, opts) taking
-- positions, mask, cache, rope_len and last_only (models/llama.lua,
-- models/gpt2.lua). Prompts of different lengths are left-padded to one
-- batch: each row's positions count from its own first token (RoPE angles
-- and GPT-2's position table as for that prompt alone), and a key mask
-- keeps padding out of every query's attention, so a row's tokens are the
-- ones it gets alone (up to the rounding of batched products).
--
-- [Note: the KV cache]
-- One K and one V buffer per layer, [B, KV heads, positions, head_dim] in
-- the model's dtype, allocated once before the prompt runs. Attention
-- (nn.Attention, opts.kv_cache) hands each call's keys and values (after
-- RoPE) to its layer's update and attends to what that returns: nothing
-- is reallocated per token. Grouped-query models cache their KV heads
-- only. Because queries no longer start at key 0, the causal mask comes
-- from here (query at cache position p sees keys <= p that are not
-- padding), not from the attention's top-left causal flag. Positions are
-- the cache's, padding included, as transformers counts them for its
-- sliding-window masks.
--
-- A global layer's buffer holds every position (prompt + max_new_tokens):
-- update copies the new keys into the next free positions and returns a
-- narrowed view of everything so far, in position order, which the
-- model's mask (built here) describes. A windowed nn.Attention adds its
-- band (keys > p - window) to that mask from the same positions.
--
-- A sliding layer (kv_cache_spec().windows[i] = W, and W < the positions
-- generated) keeps a ring of W positions: position p lives in slot p % W.
-- A query at p sees keys p - W + 1 ... p, so one decoded token (written
-- first, over position p - W) attends to the whole ring; the ring is in
-- slot order, not position order (RoPE was applied before caching, so the
-- order changes nothing but the mask). Such a layer's update therefore
-- returns a third value, the mask for its own keys ([B, 1, T, S], padding,
-- causality and the band together), which replaces the model's. Its
-- ingredients are kept beside the ring, once per window size: the
-- position and the not-padding flag of every slot (Cache.key_ok, the
-- padding of each row, is the source). A chunk of T > 1 queries at p0
-- needs the W - 1 keys before it as well as its own, W - 1 + T in all: it
-- attends to the ring's old slots followed by the chunk (one cat, the only
-- copy; generate's prompt starts at p0 = 0, where there are no old slots),
-- and then its last min(T, W) positions go into the ring. The cache of a
-- layer thus costs min(W, positions) instead of all positions (Gemma 3
-- with 512 and 32k positions: five of six layers 64x smaller); use_cache =
-- 'full' keeps every position in every layer (the reference the rings are
-- tested against), and M.cache_bytes is what the recipe plans with.
--
-- Token choice (M.sampler, HF's order): the repetition penalty on the raw
-- logits (a seen token's logit divided by the penalty when positive,
-- multiplied when negative), then greedy argmax, or, with do_sample,
-- temperature, top-k, top-p, and a draw. Everything is a tensor op over
-- [B, V]: no sort is needed, because the k-th largest logit and the
-- nucleus threshold are found by bisection on the value (each step one
-- compare and one sum per row), and the draw is Gumbel-max (argmax of
-- logits + -log(-log u)), an exact sample of softmax(logits) that keeps
-- filtered tokens (-inf) out. u comes from the counter-based generator
-- keyed by (seed, step), so a seed gives the same text run to run and
-- rank to rank.
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local F = require 'fsdp.functional'
local validate = require 'fsdp.validate'

local M = {}

local function fail(fmt, ...) core.fail('generate: ' .. fmt:format(...)) end

-- options ----------------------------------------------------------------------------------

-- Every option, its default and what it must be (checked before anything
-- runs; recipes/generate.lua declares the same constraints).
M.DEFAULTS = { max_new_tokens = 32, do_sample = false, temperature = 1, top_k = 0, top_p = 1,
               repetition_penalty = 1, stop_ids = {}, pad_id = 0, seed = 0, use_cache = true,
               allow_past_max_positions = false }

local function check_options(opts)
  local o = {}
  for k, v in pairs(M.DEFAULTS) do o[k] = v end
  for k, v in pairs(opts or {}) do
    if M.DEFAULTS[k] == nil and k ~= 'on_token' then fail('unknown option %s', tostring(k)) end
    o[k] = v
  end
  -- (fsdp.validate decides: NaN and infinity pass none of these)
  local function int(k, min)
    if validate.problem(o[k], { int = true, min = min }) then
      fail('%s must be an integer >= %d, got %s', k, min, validate.show(o[k]))
    end
  end
  int('max_new_tokens', 1); int('top_k', 0); int('pad_id', 0); int('seed', 0)
  if o.use_cache ~= true and o.use_cache ~= false and o.use_cache ~= 'full' then
    fail("use_cache must be true, false or 'full', got %s", validate.show(o.use_cache))
  end
  if validate.problem(o.temperature, validate.POSITIVE) then
    fail('temperature must be > 0, got %s (greedy decoding: do_sample = false)', validate.show(o.temperature))
  end
  if validate.problem(o.top_p, { positive = true, max = 1 }) then
    fail('top_p must be in (0, 1], got %s', validate.show(o.top_p))
  end
  if validate.problem(o.repetition_penalty, validate.POSITIVE) then
    fail('repetition_penalty must be > 0, got %s', validate.show(o.repetition_penalty))
  end
  if type(o.stop_ids) ~= 'table' then fail('stop_ids must be a list of ids, got %s', type(o.stop_ids)) end
  for _, id in ipairs(o.stop_ids) do
    if validate.problem(id, validate.INDEX) then fail('stop id %s is not a token id', validate.show(id)) end
  end
  if o.on_token ~= nil and type(o.on_token) ~= 'function' then fail('on_token must be a function') end
  return o
end
M.check_options = check_options

-- the sampler ------------------------------------------------------------------------------

-- The largest value t per row (x [B, V] f32) with count(x >= t) >= k: the
-- k-th largest logit, ties included (HF's top-k keeps ties too). Bisection
-- keeps count(x >= lo) >= k > count(x >= hi) from the smallest finite
-- logit up; 64 halvings of that range leave no other logit between lo and
-- the k-th one, and the search stops early once every row keeps exactly
-- k. A row with fewer than k finite logits keeps them all.
local function kth_largest(x, k)
  -- the smallest finite logit: from -inf (a masked token) no number of
  -- halvings would get near the others
  local lo = F.clamp(F.min(F.where(F.gt(x, -math.huge), x, math.huge), -1, true), nil, 3e38)
  local hi = F.max(x, -1, true) + 1
  for i = 1, 64 do
    local mid = (lo + hi) * 0.5
    local enough = F.ge(F.sum(F.ge(x, mid):to('f32'), -1, true), k)
    lo, hi = F.where(enough, mid, lo), F.where(enough, hi, mid)
    if i % 8 == 0 and F.sum(F.ne(F.sum(F.ge(x, lo):to('f32'), -1, true), k):to('f32')):item() == 0 then break end
  end
  return lo
end

-- The nucleus threshold per row (p [B, V] probabilities): the largest t
-- with sum(p where p >= t) >= top_p, so {p >= t} is the smallest set of
-- the most likely tokens holding top_p of the mass (at least the top one).
-- 40 halvings of [0, 1]: tokens within 1e-12 below the threshold may join.
local function nucleus_threshold(p, top_p)
  local B = p:size(0)
  local lo = fsdp.zeros({ B, 1 }, { dtype = p.dtype, device = p.device })
  local hi = F.max(p, -1, true) + 1e-6
  for _ = 1, 40 do
    local mid = (lo + hi) * 0.5
    local mass = F.sum(F.where(F.ge(p, mid), p, 0), -1, true)
    local enough = F.ge(mass, top_p)
    lo, hi = F.where(enough, mid, lo), F.where(enough, hi, mid)
  end
  return lo
end

local Sampler = {}
Sampler.__index = Sampler

-- A sampler for B rows over a vocabulary of V on a device; opts as
-- M.DEFAULTS (checked). Keeps which rows are done and, for the repetition
-- penalty, which tokens each row has seen.
function M.sampler(opts, B, V, device)
  local o = check_options(opts)
  local s = setmetatable({ opts = o, B = B, V = V, device = device, step = 0 }, Sampler)
  s.done = fsdp.zeros({ B, 1 }, { dtype = 'bool', device = device })
  s.vocab = fsdp.arange(V, { dtype = 'i64', device = device }):view(1, 1, V)
  if o.repetition_penalty ~= 1 then s.seen = fsdp.zeros({ B, V }, { dtype = 'f32', device = device }) end
  return s
end

-- Mark the tokens of ids i64 [B, T] as seen (valid: bool [B, T], false at
-- padding), in slices of 64 positions so the one-hot stays small.
function Sampler:observe(ids, valid)
  if not self.seen then return end
  local T = ids:size(1)
  for t0 = 0, T - 1, 64 do
    local n = math.min(64, T - t0)
    local hot = F.eq(ids:narrow(1, t0, n):unsqueeze(2), self.vocab) -- [B, n, V]
    if valid then hot = F.where(valid:narrow(1, t0, n):unsqueeze(2), hot, false) end
    self.seen = self.seen + F.sum(hot:to('f32'), 1)
  end
end

-- The logits a choice is made from: f32 [B, V], the repetition penalty
-- applied (greedy decoding sees it too, as in HF).
function Sampler:penalized(logits)
  local x = logits:to('f32')
  local r = self.opts.repetition_penalty
  if self.seen then
    local pen = F.where(F.lt(x, 0), x * r, x * (1 / r))
    x = F.where(F.gt(self.seen, 0), pen, x)
  end
  return x
end

-- The filtered logits sampling draws from: temperature, then top-k, then
-- top-p; removed tokens are -inf.
function Sampler:warped(x)
  local o = self.opts
  if o.temperature ~= 1 then x = x * (1 / o.temperature) end
  if o.top_k > 0 and o.top_k < self.V then x = F.where(F.ge(x, kth_largest(x, o.top_k)), x, -math.huge) end
  if o.top_p < 1 then
    local p = F.softmax(x, -1)
    x = F.where(F.ge(p, nucleus_threshold(p, o.top_p)), x, -math.huge)
  end
  return x
end

-- The next token of every row from logits [B, V] (any float dtype): i64
-- [B, 1]; rows already done get pad_id. Updates done (a stop id came) and
-- the seen tokens.
function Sampler:next(logits)
  self.step = self.step + 1
  local o = self.opts
  local x = self:penalized(logits)
  local nxt
  if o.do_sample then
    x = self:warped(x)
    local u = fsdp.rand({ self.B, self.V }, { seed = o.seed, stream = self.step, device = self.device })
    nxt = F.argmax(x - F.log(-F.log(u)), -1, true)
  else
    nxt = F.argmax(x, -1, true)
  end
  nxt = F.where(self.done, o.pad_id, nxt)
  for _, id in ipairs(o.stop_ids) do self.done = F.where(F.eq(nxt, id), true, self.done) end
  self:observe(nxt)
  return nxt
end

function Sampler:all_done()
  return F.sum(self.done:to('i64')):item() == self.B
end

-- the KV cache -----------------------------------------------------------------------------

local LayerCache = {}
LayerCache.__index = LayerCache

-- nn.Attention's hook: store k, v [B, KV, T, hd] at the cache's current
-- length and return views of all the keys and values so far.
function LayerCache:update(k, v)
  local pos, T = self.cache.length, k:size(2)
  if pos + T > self.capacity then
    fail('KV cache overflow: %d cached + %d new positions > capacity %d', pos, T, self.capacity)
  end
  self.k:narrow(2, pos, T):copy_(k)
  self.v:narrow(2, pos, T):copy_(v)
  return self.k:narrow(2, 0, pos + T), self.v:narrow(2, 0, pos + T)
end

-- Copy m entries of src (along dim, from src_at on) into the ring buf of
-- W slots from slot s0 on, wrapping past the last slot once.
local function ring_write(buf, dim, src, src_at, s0, m, W)
  local first = math.min(m, W - s0)
  buf:narrow(dim, s0, first):copy_(src:narrow(dim, src_at, first))
  if first < m then buf:narrow(dim, 0, m - first):copy_(src:narrow(dim, src_at + first, m - first)) end
end

local RingCache = {}
RingCache.__index = RingCache

-- A sliding layer's hook (see the Note): returns this call's keys, values
-- and the mask for them.
function RingCache:update(k, v)
  local c, W = self.cache, self.window
  local p0, T = c.length, k:size(2)
  if p0 + T > c.capacity then
    fail('KV cache overflow: %d cached + %d new positions > capacity %d', p0, T, c.capacity)
  end
  local mask = c:ring_mask(W, p0, T)
  if T == 1 then
    -- over position p0 - W: the ring is then exactly the query's window
    self.k:narrow(2, p0 % W, 1):copy_(k)
    self.v:narrow(2, p0 % W, 1):copy_(v)
    local n = math.min(p0 + 1, W)
    return self.k:narrow(2, 0, n), self.v:narrow(2, 0, n), mask
  end
  local n_old = math.min(p0, W)
  local keys, values = k, v
  if n_old > 0 then
    keys = F.cat({ self.k:narrow(2, 0, n_old), k }, 2)
    values = F.cat({ self.v:narrow(2, 0, n_old), v }, 2)
  end
  local m = math.min(T, W)
  ring_write(self.k, 2, k, T - m, (p0 + T - m) % W, m, W)
  ring_write(self.v, 2, v, T - m, (p0 + T - m) % W, m, W)
  return keys, values, mask
end

local Cache = {}
Cache.__index = Cache

-- The positions layer i of a cache for `capacity` positions holds: its
-- window where that is smaller (a ring), else all of them.
local function layer_positions(spec, i, capacity)
  local w = spec.windows and spec.windows[i]
  if w and w < capacity then return w end
  return capacity
end

-- The positions each layer's cache holds ({n_layers} list) and the bytes
-- of all its K and V buffers, for B rows of `capacity` positions in dtype
-- ('f32', 'bf16', ...); spec: a model's kv_cache_spec() (windows: each
-- layer's sliding window or false). What the recipe plans with.
function M.cache_positions(spec, capacity)
  local out = {}
  for i = 1, spec.n_layers do out[i] = layer_positions(spec, i, capacity) end
  return out
end

function M.cache_bytes(spec, B, capacity, dtype)
  local size = tonumber(core.C.fl_dtype_size(core.dtype(dtype)))
  local n = spec.n_layers * capacity -- (no windows: no walk over the layers)
  if spec.windows then
    n = 0
    for _, p in ipairs(M.cache_positions(spec, capacity)) do n = n + p end
  end
  return 2 * B * spec.n_kv_heads * spec.head_dim * n * size
end

-- A cache for `model` (its kv_cache_spec()) of B rows and `capacity`
-- positions, in opts.dtype on opts.device. opts.key_ok: bool [B,
-- capacity], false at padding (default: none); opts.full: every layer
-- holds every position (no rings). See [Note: the KV cache].
function M.kv_cache(model, B, capacity, opts)
  local spec = model:kv_cache_spec()
  local c = setmetatable({ length = 0, capacity = capacity, layers = {}, rings = {}, B = B }, Cache)
  local place = { dtype = opts.dtype, device = opts.device }
  c.key_ok = opts.key_ok or fsdp.ones({ B, capacity }, { dtype = 'bool', device = opts.device })
  c.col = fsdp.arange(capacity, { dtype = 'i64', device = opts.device })
  for i = 1, spec.n_layers do
    local n = opts.full and capacity or layer_positions(spec, i, capacity)
    local layer = { cache = c, capacity = capacity,
                    k = fsdp.empty({ B, spec.n_kv_heads, n, spec.head_dim }, place),
                    v = fsdp.empty({ B, spec.n_kv_heads, n, spec.head_dim }, place) }
    if n < capacity then
      layer.window = n
      if not c.rings[n] then
        c.rings[n] = { ok = fsdp.empty({ B, n }, { dtype = 'bool', device = opts.device }),
                       pos = fsdp.empty({ n }, { dtype = 'i64', device = opts.device }) }
      end
      c.layers[i] = setmetatable(layer, RingCache)
    else
      c.layers[i] = setmetatable(layer, LayerCache)
    end
  end
  return c
end

function Cache:layer(i) return self.layers[i] end

-- The mask of T queries at p0 ... p0 + T - 1 over the keys a ring of W
-- returns for them (RingCache:update), computed by the first of the
-- layers sharing W in a forward; the ring's slot positions and flags then
-- move on to include this call's positions.
function Cache:ring_mask(W, p0, T)
  local r = self.rings[W]
  if r.memo then return r.memo end
  local B, mask = self.B, nil
  if T == 1 then
    local s = p0 % W
    r.ok:narrow(1, s, 1):copy_(self.key_ok:narrow(1, p0, 1))
    r.pos:narrow(0, s, 1):copy_(self.col:narrow(0, p0, 1))
    local n = math.min(p0 + 1, W)
    mask = r.ok:narrow(1, 0, n):view(B, 1, 1, n)
  else
    local n_old = math.min(p0, W)
    local kpos, ok = self.col:narrow(0, p0, T), self.key_ok:narrow(1, p0, T)
    if n_old > 0 then
      kpos = F.cat({ r.pos:narrow(0, 0, n_old), kpos }, 0)
      ok = F.cat({ r.ok:narrow(1, 0, n_old), ok }, 1)
    end
    local S = n_old + T
    local q = self.col:narrow(0, p0, T):view(T, 1)
    kpos = kpos:view(1, S)
    -- causal (key <= query) and within the window (key > query - W)
    local band = F.where(F.le(kpos, q), F.gt(kpos, q - W), false):view(1, 1, T, S)
    mask = F.where(band, ok:view(B, 1, 1, S), false)
    local m = math.min(T, W)
    ring_write(r.ok, 1, self.key_ok, p0 + T - m, (p0 + T - m) % W, m, W)
    ring_write(r.pos, 0, self.col, p0 + T - m, (p0 + T - m) % W, m, W)
  end
  r.memo = mask
  return mask
end

-- The bytes of every layer's K and V buffers.
function Cache:bytes()
  local n = 0
  for _, l in ipairs(self.layers) do n = n + (l.k:numel() + l.v:numel()) * l.k:element_size() end
  return n
end

-- After a forward: its T positions are now cached.
function Cache:advance(T)
  self.length = self.length + T
  for _, r in pairs(self.rings) do r.memo = nil end
end

-- decoding ---------------------------------------------------------------------------------

-- prompts: a list of id lists (Lua numbers), or an i64 tensor [B, T] of
-- unpadded prompts of one length. Returns the ids [B, L] left-padded with
-- pad_id (on device) and each prompt's length.
local function pad_prompts(prompts, pad_id, device)
  if fsdp.is_tensor(prompts) then
    if prompts:dim() ~= 2 then fail('a prompt tensor must be [batch, length], got %d dims', prompts:dim()) end
    local lens = {}
    for b = 1, prompts:size(0) do lens[b] = prompts:size(1) end
    return prompts:to(device):to('i64'), lens
  end
  if type(prompts) ~= 'table' or #prompts == 0 then fail('prompts must be a non-empty list of id lists') end
  local L, lens = 0, {}
  for b, p in ipairs(prompts) do
    if type(p) ~= 'table' or #p == 0 then fail('prompt %d is empty (a prompt needs at least one token)', b) end
    lens[b] = #p
    L = math.max(L, #p)
  end
  local rows = {}
  for b, p in ipairs(prompts) do
    local row = {}
    for i = 1, L - #p do row[i] = pad_id end
    for i, id in ipairs(p) do row[L - #p + i] = id end
    rows[b] = row
  end
  return fsdp.tensor(rows, { dtype = 'i64', device = device }), lens
end

-- The model's dtype and device: its first parameter's.
local function placement(model)
  local p = model:parameters()[1]
  return { dtype = p.dtype, device = p.device }
end

-- Generate for a batch of prompts (see the top of this file). opts: as
-- M.DEFAULTS, plus on_token(step, tokens, done) called after every step
-- with the step's ids ({row -> id}, pad_id for finished rows) and whether
-- each row is done ({row -> bool}), and use_cache = false to recompute the
-- whole prefix at every step instead (the reference the cache is tested
-- against, and the benchmark's baseline), or 'full' to keep every position
-- in every layer's cache, sliding layers' too (the reference their rings
-- are tested against). Returns a list per prompt of its
-- new ids (up to and including its stop id), and {steps =, prompt_len =}.
function M.generate(model, prompts, opts)
  local o = check_options(opts)
  if type(model) ~= 'table' or type(model.kv_cache_spec) ~= 'function' then
    fail('the model has no kv_cache_spec(): a causal LM of models/llama.lua or models/gpt2.lua is needed')
  end
  local place = placement(model)
  local ids, lens = pad_prompts(prompts, o.pad_id, place.device)
  local B, L = ids:size(0), ids:size(1)
  local cap = L + o.max_new_tokens
  local spec = model:kv_cache_spec()
  -- ([Note: positions past the model's limit] in models/decoders.lua)
  if spec.max_positions and cap > spec.max_positions and not (spec.extrapolates and o.allow_past_max_positions) then
    fail('the longest prompt (%d tokens) plus max_new_tokens (%d) exceeds the model\'s %d positions%s',
      L, o.max_new_tokens, spec.max_positions,
      spec.extrapolates and ' (allow_past_max_positions = true runs past them: RoPE extrapolates)' or '')
  end
  local was_training = model.training
  if was_training then model:eval() end
  local out = {}
  for b = 1, B do out[b] = {} end
  local steps = 0
  local ok, err = pcall(fsdp.no_grad, function()
    local dev = place.device
    -- Row b's padding is its first L - len_b positions; positions count
    -- from its first token (padding gets 0: it is masked anyway).
    local pad = {}
    for b = 1, B do pad[b] = L - lens[b] end
    local pad_t = fsdp.tensor(pad, { dtype = 'i64', device = dev }):view(B, 1)
    local col = fsdp.arange(cap, { dtype = 'i64', device = dev }):view(1, cap)
    local positions = F.clamp(col - pad_t, 0)             -- [B, cap]
    local key_ok = F.ge(col, pad_t):view(B, 1, 1, cap)    -- not padding
    -- The mask of T queries at cache positions p0 ... p0+T-1 over keys 0 ... p0+T-1.
    local function mask(p0, T)
      local S = p0 + T
      -- one query, the newest position: every earlier key is in its past
      if T == 1 then return key_ok:narrow(3, 0, S) end
      local rows = fsdp.arange(T, { dtype = 'i64', device = dev }):view(T, 1) + p0
      local causal = F.le(col:narrow(1, 0, S), rows):view(1, 1, T, S)
      return F.where(causal, key_ok:narrow(3, 0, S), false)
    end
    local function at(p0, T) return positions:narrow(1, p0, T):contiguous() end

    local cache = o.use_cache and M.kv_cache(model, B, cap, { dtype = place.dtype, device = dev,
      key_ok = key_ok:view(B, cap), full = o.use_cache == 'full' }) or nil
    local seq = ids
    local logits = model(ids, { positions = at(0, L), mask = mask(0, L), cache = cache, rope_len = cap,
                                last_only = true })
    if cache then cache:advance(L) end
    local V = logits:size(2)
    local sampler = M.sampler(o, B, V, dev)
    sampler:observe(ids, key_ok:view(B, cap):narrow(1, 0, L))
    local stopped = {}
    for step = 1, o.max_new_tokens do
      local nxt = sampler:next(logits:view(B, V))
      steps = step
      local list, done = nxt:view(B):tolist(), sampler.done:view(B):tolist()
      for b = 1, B do
        -- a row keeps the stop id that finished it, then nothing
        if not stopped[b] then
          out[b][#out[b] + 1] = list[b]
          stopped[b] = done[b]
        end
      end
      if o.on_token then o.on_token(step, list, done) end
      if step == o.max_new_tokens or sampler:all_done() then break end
      local p0 = L + step - 1
      if cache then
        logits = model(nxt, { positions = at(p0, 1), mask = mask(p0, 1), cache = cache, rope_len = cap,
                              last_only = true })
        cache:advance(1)
      else
        seq = F.cat({ seq, nxt }, 1)
        logits = model(seq, { positions = at(0, p0 + 1), mask = mask(0, p0 + 1), rope_len = cap,
                              last_only = true })
      end
    end
  end)
  if was_training then model:train() end
  if not ok then error(err, 0) end
  return out, { steps = steps, prompt_len = L }
end

return M
