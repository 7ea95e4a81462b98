-- llama_spec.lua: models/llama.lua against the facts of MODELS.md (exact
-- parameter counts on meta, Llama-2-70B built quickly in little memory)
-- and a tiny Llama that learns structured synthetic data, deterministically.
-- The comparison with Hugging Face's LlamaForCausalLM (logits, loss,
-- gradients) is hf_llama_spec.lua.
local fsdp = require 'fsdp'
local llama = require 'models.llama'

describe('Llama configs', function()
  local expected = {
    ['Llama-2-7b'] = 6738415616, ['Llama-2-13b'] = 13015864320, ['Llama-2-70b'] = 68976648192,
    ['Llama-3.1-8B'] = 8030261248, ['Llama-3.1-70B'] = 70553706496,
    ['Llama-3.2-1B'] = 1235814400, ['Llama-3.2-3B'] = 3212749824,
  }
  for name, count in pairs(expected) do
    it(name .. ' has ' .. count .. ' parameters on meta', function()
      local m = llama.build(name, { device = 'meta' })
      assert.equals(count, m:num_parameters())
      assert.equals(count, llama.closed_form_parameters(m.config))
    end)
  end

  it('the seed log\'s 7B with a 50,432-token vocabulary has 6,889,410,560', function()
    assert.equals(6889410560, llama.build('Llama-2-7b', { device = 'meta', vocab_size = 50432 }):num_parameters())
  end)

  it('builds Llama-2-70b on meta in under 2 s and 200 MB, allocating nothing', function()
    -- In a fresh process: this one's resident size carries whatever earlier
    -- specs left in the allocator's cache.
    local host = require 'fsdp.host'
    local code = [[
      local clock = require 'fsdp.clock'
      local t0 = clock.now()
      local m = require('models.llama').build('Llama-2-70b', { device = 'meta' })
      local n, dt = m:num_parameters(), clock.now() - t0
      local rss
      for line in io.lines('/proc/self/status') do rss = rss or line:match('^VmRSS:%s+(%d+)') end
      io.write(('%d %.3f %d %d'):format(n, dt, tonumber(rss), require('fsdp').memory_stats('cpu').in_use))
    ]]
    local p = io.popen(("%s -e %q 2>&1"):format(host.exe, code))
    local out = p:read('*a')
    p:close()
    local n, dt, rss_kb, in_use = out:match('^(%d+) ([%d.]+) (%d+) (%d+)$')
    assert(n, out)
    assert.equals(68976648192, tonumber(n))
    assert.equals(0, tonumber(in_use))
    -- Time and memory budgets hold for the release build; the sanitizer
    -- build runs several times slower with shadow memory on top.
    if not fsdp.build_info:find('asan') then
      assert.is_true(tonumber(dt) < 2, ('took %s s'):format(dt))
      assert.is_true(tonumber(rss_kb) / 1024 < 200, ('resident %.0f MB'):format(tonumber(rss_kb) / 1024))
    end
  end)

  it('uses Hugging Face names and ties lm_head to the embedding when the config says so', function()
    local m = llama.build('tiny', { device = 'meta', tied = true })
    local names = {}
    for _, p in ipairs(m:named_parameters()) do names[#names + 1] = p[1] end
    assert.equals('model.embed_tokens.weight', names[1])
    assert.equals('model.layers.0.self_attn.q_proj.weight', names[2])
    assert.equals('model.norm.weight', names[#names])
    assert.equals(m.model.embed_tokens.weight, m.lm_head.weight)
  end)

  it('rejects inconsistent configs with a clear message', function()
    assert.has_error(function() llama.build('tiny', { device = 'meta', n_heads = 3 }) end)
    assert.error_matches(function() llama.build('Llama-9', { device = 'meta' }) end, "unknown config 'Llama%-9'")
  end)
end)

describe('training a tiny Llama', function()
  local synthetic = require 'fsdp.data.synthetic'
  local optim = require 'fsdp.optim'

  local function train(steps)
    local c = llama.config('tiny', { dim = 32, n_heads = 4, n_kv_heads = 2, ffn_dim = 96, vocab_size = 64 })
    local model = llama.build(c)
    model:init_weights({ seed = 3 })
    local opt = optim.AdamW(model:named_parameters(), { lr = 1e-2, weight_decay = 0 })
    local data = synthetic.Markov(c.vocab_size, { seed = 3, noise = 0.05 })
    local losses = {}
    for step = 1, steps do
      local ids, targets = data:batch(step - 1, 8, 32)
      local loss = model:loss(ids, targets)
      loss:backward()
      optim.clip_grad_norm_(model:parameters(), 1.0)
      opt:step()
      opt:zero_grad()
      losses[step] = loss:item()
    end
    return losses, data:entropy(), math.log(c.vocab_size)
  end

  it('learns structured data far below ln(vocab), the same way every time', function()
    local losses, entropy, uniform = train(120)
    local last = (losses[118] + losses[119] + losses[120]) / 3
    assert.is_true(losses[1] > uniform - 0.3, ('first loss %.3f'):format(losses[1]))
    assert.is_true(last < uniform / 3, ('final loss %.3f vs ln(V) %.3f'):format(last, uniform))
    assert.is_true(last < entropy + 0.5, ('final loss %.3f vs entropy %.3f'):format(last, entropy))
    local again = train(5)
    for i = 1, 5 do assert.equals(losses[i], again[i]) end
  end)
end)
