-- hf_gpt2_spec.lua: our GPT-2 against Hugging Face's GPT2LMHeadModel on the
-- checkpoint tests/golden/make_hf5_goldens.py saved with transformers 5
-- (Conv1D weights stored [in, out], the head tied to wte and not in the
-- file), and our save_pretrained's directory loading back.
--
-- Tolerances: float64 is HF's own model converted to float64 (GPT-2 keeps
-- no float32 islands): measured 4.4e-15 on logits up to ~6, asserted
-- 1e-12; float32 against the stock model: measured 1.7e-6, asserted 2e-5
-- (the issue's bound is 1e-4).
local fsdp = require 'fsdp'
local hf = require 'models.hf'
local json = require 'fsdp.io.json'
local T = require 'fsdp.testing'

local DIR = 'tests/golden/hf/gpt2_tiny'

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

describe('Hugging Face GPT-2 (transformers 5)', function()
  local g = fsdp.load_safetensors(DIR .. '/golden.safetensors')

  it('builds the config HF saved', function()
    local c = hf.from_pretrained(DIR, { device = 'meta' }).config
    assert.equals(32, c.dim)
    assert.equals(2, c.n_layers)
    assert.equals(4, c.n_heads)
    assert.equals(128, c.ffn_dim) -- n_inner null: 4 * n_embd
    assert.equals(16, c.max_seq_len)
    assert.equals(0, c.resid_pdrop)
  end)

  it('float64: logits equal HF\'s to rounding', function()
    local m = hf.from_pretrained(DIR, { dtype = 'f64' })
    local d = T.max_abs_diff(m(g.input_ids), g.logits_f64)
    assert(d < 1e-12, ('logits differ by %g'):format(d))
  end)

  it('float32: logits and loss equal the stock HF model\'s', function()
    local m = hf.from_pretrained(DIR, { dtype = 'f32' })
    local loss, logits = m:loss(g.input_ids, g.labels)
    local d = T.max_abs_diff(logits, g.logits_f32)
    assert(d < 2e-5, ('logits differ by %g'):format(d))
    assert.is_true(math.abs(loss:item() - g.loss_f32:item()) < 2e-5)
  end)

  it('save_pretrained writes HF\'s layout (Conv1D [in, out], no lm_head) and loads back equal', function()
    local m = hf.from_pretrained(DIR, { dtype = 'f32' })
    local out = os.tmpname()
    os.remove(out)
    hf.save_pretrained(m, out)
    local saved = fsdp.load_safetensors(out .. '/model.safetensors')
    local theirs = fsdp.load_safetensors(DIR .. '/model.safetensors')
    assert.is_nil(saved['lm_head.weight'])
    for name, t in pairs(theirs) do
      assert.equals(0, T.max_abs_diff(saved[name], t), name)
    end
    local h = json.decode(read(out .. '/config.json'))
    assert.equals('gpt2', h.model_type)
    assert.equals('gelu_new', h.activation_function)
    local back = hf.from_pretrained(out, { dtype = 'f32' })
    assert.equals(0, T.max_abs_diff(back(g.input_ids), m(g.input_ids)))
    os.execute('rm -rf ' .. out)
  end)

  it('a checkpoint of another size is an error naming the tensor', function()
    local out = os.tmpname()
    os.remove(out)
    os.execute('mkdir -p ' .. out .. ' && cp ' .. DIR .. '/model.safetensors ' .. out .. '/')
    local h = json.decode(read(DIR .. '/config.json'))
    h.n_embd = 64
    local f = assert(io.open(out .. '/config.json', 'wb'))
    f:write(json.encode(h))
    f:close()
    assert.error_matches(function() hf.from_pretrained(out, { device = 'meta' }) end,
      'size mismatch for transformer%.h%.0%.attn%.c_attn%.bias')
    os.execute('rm -rf ' .. out)
  end)
end)
