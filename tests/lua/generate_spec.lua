-- generate_spec.lua: fsdp.generate on tiny random Llama (multi-head and
-- grouped-query) and GPT-2 models. The reference for greedy decoding is
-- the plainest one: each prompt alone, the model run on the whole prefix
-- (model(ids), no cache, no mask, no positions) and the last position's
-- argmax appended, step after step. The KV-cached batch of left-padded
-- prompts, the uncached batch and each prompt alone must give exactly its
-- tokens. Then the sampling options: top_k = 1 and a tiny top_p are
-- greedy, a seed reproduces a draw, the repetition penalty changes the
-- output deterministically, stop ids stop their row only.
local fsdp = require 'fsdp'
local F = require 'fsdp.functional'
local llama = require 'models.llama'
local gpt2 = require 'models.gpt2'
local generate = require 'fsdp.generate'

local PROMPTS = { { 5, 17, 99, 3, 42, 7, 8 }, { 11, 200 }, { 64, 1, 2, 3, 77 } }
local NEW = 12

local function reference_greedy(model, prompt, n)
  local ids = fsdp.tensor({ prompt }, { dtype = 'i64' })
  local out = {}
  fsdp.no_grad(function()
    for _ = 1, n do
      local logits = model(ids)
      local nxt = F.argmax(logits:narrow(1, ids:size(1) - 1, 1), -1):view(1, 1)
      out[#out + 1] = nxt:item()
      ids = F.cat({ ids, nxt }, 1)
    end
  end)
  return out
end

local function same(a, b, what)
  assert(#a == #b, ('%s: %d tokens, expected %d'):format(what, #a, #b))
  for i = 1, #a do
    assert(a[i] == b[i], ('%s: token %d is %d, expected %d (got {%s}, expected {%s})'):format(
      what, i, a[i], b[i], table.concat(a, ','), table.concat(b, ',')))
  end
end

local MODELS = {
  { 'Llama multi-head', function() return llama.build('tiny', { n_kv_heads = 4 }) end },
  { 'Llama grouped-query', function() return llama.build('tiny', { n_heads = 4, n_kv_heads = 2 }) end },
  -- A wider init than GPT-2's 0.02: with the head tied to the embedding,
  -- a small random GPT-2 only repeats its last token, which would not show
  -- wrong positions or masks.
  { 'GPT-2', function() return gpt2.build('tiny', { init_std = 0.5 }) end, untouched_head = true },
}

for i, m in ipairs(MODELS) do
  describe('greedy generation, ' .. m[1], function()
    local model = m[2]()
    model:init_weights({ seed = 10 + i })
    -- Random tiny models give flat logits; scaling the head up makes the
    -- argmax decisive (no near-ties that rounding could flip) without
    -- changing what is computed.
    if not m.untouched_head then
      fsdp.no_grad(function()
        local w = model.lm_head.weight
        w:copy_(w * 8)
      end)
    end
    local refs = {}
    for b, p in ipairs(PROMPTS) do refs[b] = reference_greedy(model, p, NEW) end

    it('a left-padded batch with the KV cache equals each prompt alone without it', function()
      local rows = generate.generate(model, PROMPTS, { max_new_tokens = NEW })
      for b = 1, #PROMPTS do same(rows[b], refs[b], 'row ' .. b) end
    end)

    it('the batch without the cache (whole prefix recomputed) equals it too', function()
      local rows = generate.generate(model, PROMPTS, { max_new_tokens = NEW, use_cache = false })
      for b = 1, #PROMPTS do same(rows[b], refs[b], 'uncached row ' .. b) end
    end)

    it('each prompt alone with the cache equals the reference', function()
      for b, p in ipairs(PROMPTS) do
        same(generate.generate(model, { p }, { max_new_tokens = NEW })[1], refs[b], 'alone ' .. b)
      end
    end)

    it('top_k = 1 and a tiny top_p sample the greedy tokens', function()
      local k1 = generate.generate(model, PROMPTS, { max_new_tokens = NEW, do_sample = true, top_k = 1, seed = 3 })
      local p0 = generate.generate(model, PROMPTS, { max_new_tokens = NEW, do_sample = true, top_p = 1e-6,
                                                     temperature = 2, seed = 4 })
      for b = 1, #PROMPTS do
        same(k1[b], refs[b], 'top_k=1 row ' .. b)
        same(p0[b], refs[b], 'top_p=1e-6 row ' .. b)
      end
    end)
  end)
end

describe('sampling options', function()
  local model = llama.build('tiny')
  model:init_weights({ seed = 7 })
  local greedy = generate.generate(model, PROMPTS, { max_new_tokens = NEW })

  local function differs(a, b)
    for i = 1, math.max(#a, #b) do if a[i] ~= b[i] then return true end end
    return false
  end

  it('a seed reproduces a draw; another seed draws differently', function()
    local o = { max_new_tokens = NEW, do_sample = true, temperature = 1.5, top_k = 50, top_p = 0.9 }
    o.seed = 1
    local a = generate.generate(model, PROMPTS, o)
    local b = generate.generate(model, PROMPTS, o)
    o.seed = 2
    local c = generate.generate(model, PROMPTS, o)
    local any = false
    for r = 1, #PROMPTS do
      same(a[r], b[r], 'same seed row ' .. r)
      any = any or differs(a[r], c[r])
    end
    assert(any, 'seeds 1 and 2 drew the same tokens for every row')
  end)

  it('top-k keeps the k largest logits (ties included) and top-p the nucleus', function()
    local s = generate.sampler({ do_sample = true, top_k = 3, top_p = 1 }, 2, 6, 'cpu')
    local x = fsdp.tensor({ { 1, 5, 3, 5, -2, 0 }, { 9, 8, 7, 6, 5, 4 } }, { dtype = 'f32' })
    local kept = F.gt(s:warped(x), -math.huge):to('i64'):tolist()
    same(kept[1], { 0, 1, 1, 1, 0, 0 }, 'top-3 of row 1')
    same(kept[2], { 1, 1, 1, 0, 0, 0 }, 'top-3 of row 2')
    -- masked (-inf) logits: the search starts from the smallest finite one
    local inf = -math.huge
    local m = fsdp.tensor({ { 1, inf, 3, 2, inf, 0.5 }, { inf, 4, inf, inf, inf, inf } }, { dtype = 'f32' })
    kept = F.gt(generate.sampler({ do_sample = true, top_k = 2 }, 2, 6, 'cpu'):warped(m), inf):to('i64'):tolist()
    same(kept[1], { 0, 0, 1, 1, 0, 0 }, 'top-2 with masked logits')
    same(kept[2], { 0, 1, 0, 0, 0, 0 }, 'top-2 of a row with one finite logit')
    local p = generate.sampler({ do_sample = true, top_p = 0.7 }, 1, 4, 'cpu')
    -- probabilities 0.5, 0.3, 0.15, 0.05: 0.5 + 0.3 is the smallest set holding 0.7
    local logits = F.log(fsdp.tensor({ { 0.15, 0.5, 0.05, 0.3 } }, { dtype = 'f32' }))
    same(F.gt(p:warped(logits), -math.huge):to('i64'):tolist()[1], { 0, 1, 0, 1 }, 'top-p 0.7')
  end)

  it('the repetition penalty changes greedy output, the same way every time', function()
    local o = { max_new_tokens = NEW, repetition_penalty = 5 }
    local a = generate.generate(model, PROMPTS, o)
    local b = generate.generate(model, PROMPTS, o)
    local any = false
    for r = 1, #PROMPTS do
      same(a[r], b[r], 'penalised row ' .. r)
      any = any or differs(a[r], greedy[r])
    end
    assert(any, 'a repetition penalty of 5 changed no row')
    -- padding is no token: a padded row is penalised as it is alone, even
    -- when the pad id is the token it picks first
    local padded = generate.generate(model, PROMPTS, { max_new_tokens = NEW, repetition_penalty = 5,
                                                       pad_id = a[2][1] })
    for r, p in ipairs(PROMPTS) do same(padded[r], generate.generate(model, { p }, o)[1], 'penalised alone ' .. r) end
    -- the penalty itself: a seen positive logit divided, a negative one multiplied
    local s = generate.sampler({ repetition_penalty = 2 }, 1, 4, 'cpu')
    s:observe(fsdp.tensor({ { 0, 1 } }, { dtype = 'i64' }))
    local x = s:penalized(fsdp.tensor({ { 4, -4, 4, -4 } }, { dtype = 'f32' })):tolist()[1]
    same(x, { 2, -8, 4, -4 }, 'penalised logits')
  end)

  it('a stop id ends its row (kept as the last token) and the others go on', function()
    local stop = greedy[1][3]
    local steps = {}
    local rows = generate.generate(model, PROMPTS, {
      max_new_tokens = NEW, stop_ids = { stop }, pad_id = 0,
      on_token = function(step, tokens, done) steps[#steps + 1] = { tokens = tokens, done = done } end,
    })
    same(rows[1], { greedy[1][1], greedy[1][2], stop }, 'row 1 with stop id ' .. stop)
    for r = 2, #PROMPTS do
      local cut = {}
      for _, t in ipairs(greedy[r]) do
        cut[#cut + 1] = t
        if t == stop then break end
      end
      same(rows[r], cut, 'row ' .. r)
    end
    assert(steps[3].done[1] == true and steps[2].done[1] == false, 'row 1 is done at step 3')
    if #steps >= 4 then assert(steps[4].tokens[1] == 0, 'a finished row streams pad ids') end
  end)

  it('every row stopping ends the loop early', function()
    local stop, first = greedy[1][4], nil
    for i, t in ipairs(greedy[1]) do if t == stop and not first then first = i end end
    local steps = 0
    local rows = generate.generate(model, { PROMPTS[1] }, {
      max_new_tokens = NEW, stop_ids = { stop }, on_token = function() steps = steps + 1 end })
    assert(#rows[1] == first and steps == first, ('%d tokens in %d steps, expected %d'):format(#rows[1], steps, first))
  end)

  it('runs in bf16, grouped-query, the cache equal to recomputing', function()
    local m = llama.build('tiny', { dtype = 'bf16' })
    m:init_weights({ seed = 9 })
    local cached = generate.generate(m, PROMPTS, { max_new_tokens = 6 })
    local plain = generate.generate(m, PROMPTS, { max_new_tokens = 6, use_cache = false })
    for r = 1, #PROMPTS do same(cached[r], plain[r], 'bf16 row ' .. r) end
  end)

  it('refuses bad options and prompts with a message naming them', function()
    for _, case in ipairs({
      { { top_p = 0 }, 'top_p must be in' }, { { temperature = 0 }, 'temperature must be > 0' },
      { { max_new_tokens = 0 }, 'max_new_tokens must be an integer >= 1' },
      { { top_k = 1.5 }, 'top_k must be an integer' }, { { stop_id = 2 }, 'unknown option stop_id' },
    }) do
      local ok, err = pcall(generate.generate, model, PROMPTS, case[1])
      assert(not ok and tostring(err):find(case[2], 1, true), tostring(err))
    end
    local ok, err = pcall(generate.generate, model, { { 1 }, {} }, {})
    assert(not ok and tostring(err):find('prompt 2 is empty', 1, true), tostring(err))
    -- a cache without a mask would let the prompt's queries see their future
    local cache = generate.kv_cache(model, 1, 8, { dtype = 'f32', device = 'cpu' })
    ok, err = pcall(model.forward, model, fsdp.tensor({ { 1, 2, 3 } }, { dtype = 'i64' }), { cache = cache })
    assert(not ok and tostring(err):find('need a mask', 1, true), tostring(err))
    local g = gpt2.build('tiny')
    ok, err = pcall(generate.generate, g, { { 1, 2 } }, { max_new_tokens = 200 })
    assert(not ok and tostring(err):find("exceeds the model's 128 positions", 1, true), tostring(err))
  end)
end)

describe('t5.generate through the shared sampler', function()
  local t5 = require 'models.t5'
  local m = t5.build('tiny', { dropout_rate = 0 })
  m:init_weights({ seed = 4 })
  m:eval()
  local src = fsdp.tensor({ { 5, 9, 13, 2, 1 }, { 7, 8, 3, 1, 0 } }, { dtype = 'i64' })

  it('top_k = 1 sampling is greedy; a seed reproduces a draw; eos ends a row', function()
    local greedy = t5.generate(m, src, { max_new_tokens = 6, eos_token_id = 9999 })
    local k1 = t5.generate(m, src, { max_new_tokens = 6, eos_token_id = 9999, do_sample = true, top_k = 1, seed = 5 })
    assert.same(greedy:tolist(), k1:tolist())
    local o = { max_new_tokens = 6, eos_token_id = 9999, do_sample = true, temperature = 2, seed = 8 }
    assert.same(t5.generate(m, src, o):tolist(), t5.generate(m, src, o):tolist())
    -- the first greedy token of row 1 as eos: row 1 stops there and is padded after
    local eos = greedy:get(0, 1)
    local stopped = t5.generate(m, src, { max_new_tokens = 6, eos_token_id = eos }):tolist()
    assert.equals(eos, stopped[1][2])
    for j = 3, #stopped[1] do assert.equals(0, stopped[1][j]) end
  end)

  it('refuses an unknown option by name', function()
    local ok, err = pcall(t5.generate, m, src, { top_kk = 3 })
    assert(not ok and tostring(err):find('unknown option top_kk', 1, true), tostring(err))
  end)
end)
