-- generate_window_spec.lua: a sliding layer's KV cache is a ring of its
-- window ([Note: the KV cache] in lua/fsdp/generate.lua). Greedy decoding
-- through the rings equals decoding with every position cached
-- (use_cache = 'full') and without a cache, token for token, far past the
-- window (a window of 5 and 36 positions: seven wraps) in a left-padded
-- batch, for every windowed family (all layers sliding, alternating,
-- Gemma 3's local RoPE, fused projections); chunks of several queries on a
-- filled ring give the logits of the whole sequence; a sliding layer's
-- buffers hold W positions and the bytes planned are the bytes allocated.
local fsdp = require 'fsdp'
local generate = require 'fsdp.generate'
local decoders = require 'models.decoders'
local T = require 'fsdp.testing'
local F = fsdp.F

local W = 5

-- max |a - b| / max |b|
local function rel(a, b) return T.max_abs_diff(a, b) / F.abs(b):max():item() end
-- family, config overrides (every one with a window of W), init seed: a
-- std and seed whose greedy text varies (a random model easily repeats
-- one token, and equal constant rows would prove little)
local CASES = {
  { 'mistral', {}, 11 },
  { 'phi3', { init_std = 0.1 }, 11 },
  { 'gemma2', { num_layers = 3 }, 13 },          -- sliding, global, sliding; softcaps
  { 'gemma3_text', { num_layers = 4 }, 11 },     -- pattern 3: s, s, global, s; local RoPE
  { 'qwen2', { layer_types = { 'full_attention', 'sliding_attention' } }, 11 },
}

local function build(family, over, seed)
  local o = { sliding_window = W }
  for k, v in pairs(over) do o[k] = v end
  local mod = decoders.families[family].module
  local m = mod.build('tiny', o)
  m:init_weights({ seed = seed or 11 })
  m:eval()
  return m
end

local PROMPTS = { { 7, 3, 9, 21 }, { 5, 8, 13, 2, 40, 17, 6, 30, 11, 12, 3 }, { 60, 2, 9, 44, 1, 90, 7, 8 } }
local NEW = 25 -- 11 + 25 = 36 positions
-- prompts shorter than the window: the padding is still in the ring when decoding starts
local SHORT = { { 7, 3 }, { 5, 8, 13, 2 } }

describe('sliding-window KV caches bounded by the window', function()
  for _, case in ipairs(CASES) do
    local family, over, seed = case[1], case[2], case[3]

    it(family .. ': greedy decoding through the rings equals every position cached, and no cache', function()
      local m = build(family, over, seed)
      local windows = m:kv_cache_spec().windows
      local n_sliding = 0
      for _, w in ipairs(windows) do if w then n_sliding = n_sliding + 1 end end
      assert.is_true(n_sliding > 0)
      for _, prompts in ipairs({ PROMPTS, SHORT }) do
        local ring = generate.generate(m, prompts, { max_new_tokens = NEW })
        local full = generate.generate(m, prompts, { max_new_tokens = NEW, use_cache = 'full' })
        local none = generate.generate(m, prompts, { max_new_tokens = NEW, use_cache = false })
        for b = 1, #prompts do
          assert.equals(NEW, #ring[b])
          assert.equals(table.concat(full[b], ','), table.concat(ring[b], ','), 'row ' .. b .. ' (full cache)')
          assert.equals(table.concat(none[b], ','), table.concat(ring[b], ','), 'row ' .. b .. ' (no cache)')
          local seen, n = {}, 0
          for _, id in ipairs(ring[b]) do
            if not seen[id] then seen[id], n = true, n + 1 end
          end
          assert(n >= 4, ('row %d decodes only %d distinct tokens'):format(b, n))
        end
      end
    end)

    it(family .. ': chunks of several queries on a filled ring give the whole sequence\'s logits', function()
      local m = build(family, over, seed)
      local ids = fsdp.tensor({ { 3, 9, 4, 27, 8, 1, 50, 2, 33, 7, 12, 5, 19, 40, 6, 22, 14, 9, 60 },
                                { 0, 0, 0, 11, 6, 71, 4, 2, 8, 3, 90, 15, 7, 1, 31, 20, 5, 44, 10 } },
                              { dtype = 'i64' })
      local N, pad = ids:size(1), fsdp.tensor({ 0, 3 }, { dtype = 'i64' }):view(2, 1)
      local col = fsdp.arange(N, { dtype = 'i64' }):view(1, N)
      local positions = F.clamp(col - pad, 0)
      local key_ok = F.ge(col, pad)
      -- generate's mask: T queries at p0 ... over keys 0 ... p0 + T - 1
      local function mask(p0, n)
        local rows = fsdp.arange(n, { dtype = 'i64' }):view(n, 1) + p0
        local causal = F.le(col:narrow(1, 0, p0 + n), rows):view(1, 1, n, p0 + n)
        return F.where(causal, key_ok:narrow(1, 0, p0 + n):view(2, 1, 1, p0 + n), false)
      end
      local want = m(ids, { positions = positions, mask = mask(0, N), rope_len = N })
      local cache = generate.kv_cache(m, 2, N, { dtype = 'f32', device = 'cpu', key_ok = key_ok })
      local p0 = 0
      -- a prompt longer than the window, one token, chunks shorter and longer than it
      for _, n in ipairs({ 7, 1, 3, 1, 6, 1 }) do
        local got = m(ids:narrow(1, p0, n), { positions = positions:narrow(1, p0, n):contiguous(), mask = mask(p0, n),
                                              cache = cache, rope_len = N })
        cache:advance(n)
        -- padded queries see no key: compare row 2 from its first token
        -- (errors relative to the largest logit, f32 rounding)
        local exp = want:narrow(1, p0, n)
        local e1 = rel(got:narrow(0, 0, 1), exp:narrow(0, 0, 1))
        assert(e1 < 1e-5, ('row 1, positions %d..%d: %g'):format(p0, p0 + n - 1, e1))
        local from = math.max(p0, 3)
        if from < p0 + n then
          local e2 = rel(got:narrow(0, 1, 1):narrow(1, from - p0, p0 + n - from),
            exp:narrow(0, 1, 1):narrow(1, from - p0, p0 + n - from))
          assert(e2 < 1e-5, ('row 2, positions %d..%d: %g'):format(from, p0 + n - 1, e2))
        end
        p0 = p0 + n
      end
      assert.equals(N, p0)
    end)
  end

  it('a sliding layer\'s cache holds W positions, a global layer\'s all; bytes planned = allocated', function()
    local m = build('gemma2', { num_layers = 3 })
    local spec = m:kv_cache_spec()
    assert.same({ W, false, W }, spec.windows)
    local cache = generate.kv_cache(m, 2, 40, { dtype = 'f32', device = 'cpu' })
    local KV, hd = spec.n_kv_heads, spec.head_dim
    for i, n in ipairs({ W, 40, W }) do
      assert.same({ 2, KV, n, hd }, cache:layer(i).k:size())
      assert.same({ 2, KV, n, hd }, cache:layer(i).v:size())
    end
    assert.same({ W, 40, W }, generate.cache_positions(spec, 40))
    local bytes = 2 * 2 * KV * hd * (W + 40 + W) * 4
    assert.equals(bytes, cache:bytes())
    assert.equals(bytes, generate.cache_bytes(spec, 2, 40, 'f32'))
    assert.equals(bytes / 2, generate.cache_bytes(spec, 2, 40, 'bf16'))
    -- the family module gives the same spec from a config, before building
    assert.same(spec, decoders.families.gemma2.module.kv_cache_spec(m.config))
    -- a window as long as the run: no ring; 'full' keeps every position everywhere
    assert.same({ 4, 4, 4 }, generate.cache_positions(spec, 4))
    local full = generate.kv_cache(m, 2, 40, { dtype = 'f32', device = 'cpu', full = true })
    for i = 1, 3 do assert.equals(40, full:layer(i).k:size(2)) end
    -- Gemma 3 1B at 32k positions on meta: five of six layers hold 512
    local g3 = decoders.families.gemma3_text.module
    local c = g3.config('Gemma-3-1B')
    local pos = generate.cache_positions(g3.kv_cache_spec(c), 32768)
    local n512 = 0
    for _, p in ipairs(pos) do if p == 512 then n512 = n512 + 1 else assert.equals(32768, p) end end
    assert.equals(26 - 4, n512)
  end)

  it('refuses a use_cache that is none of true, false and \'full\'', function()
    local m = build('mistral', {})
    local ok, err = pcall(generate.generate, m, PROMPTS, { use_cache = 'ring' })
    assert(not ok and tostring(err):find("use_cache must be true, false or 'full', got", 1, true), tostring(err))
  end)
end)
