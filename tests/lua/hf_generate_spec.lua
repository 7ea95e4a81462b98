-- hf_generate_spec.lua: greedy generation against Hugging Face's
-- generate() on the golden tiny Llamas (tests/golden/hf/llama2_tiny:
-- multi-head; llama3_tiny: grouped-query, tied head, llama3 RoPE scaling)
-- and a tiny GPT-2 (tests/golden/hf_generate/gpt2_tiny, loaded through
-- gpt2.from_hf_state_dict: HF's Conv1D weights transposed).
-- tests/golden/hf_generate.json (tests/golden/make_generate_goldens.py)
-- holds HF's tokens for each prompt alone, for the prompts as one
-- left-padded batch, and alone with a repetition penalty; ours, with the
-- KV cache, must be the same ids.
local json = require 'fsdp.io.json'
local files = require 'fsdp.io.files'
local host = require 'fsdp.host'
local hf = require 'models.hf'
local generate = require 'fsdp.generate'
local fsdp = require 'fsdp'
local gpt2 = require 'models.gpt2'

local root = host.root .. '/tests/golden'
local golden = json.decode(assert(files.read(root .. '/hf_generate.json')))

local function same(got, want, what)
  assert(table.concat(got, ',') == table.concat(want, ','),
    ('%s: {%s}, HF gives {%s}'):format(what, table.concat(got, ','), table.concat(want, ',')))
end

-- The GPT-2 directory through the converter (HF's config keys are
-- gpt2.config's aliases).
local function load_gpt2(dir)
  local h = json.decode(assert(files.read(dir .. '/config.json')))
  local model = gpt2.build({ n_embd = h.n_embd, n_layer = h.n_layer, n_head = h.n_head, vocab_size = h.vocab_size,
                             n_positions = h.n_positions, layer_norm_epsilon = h.layer_norm_epsilon })
  model:load_state_dict(gpt2.from_hf_state_dict(fsdp.load_safetensors(dir .. '/model.safetensors')))
  return model
end

for _, case in ipairs({ 'llama2_tiny', 'llama3_tiny', 'gpt2_tiny' }) do
  describe('generation equals HF generate(), ' .. case, function()
    local model = case == 'gpt2_tiny' and load_gpt2(root .. '/hf_generate/gpt2_tiny')
                  or hf.from_pretrained(root .. '/hf/' .. case, { dtype = 'f32' })
    local want = golden.models[case]
    local base = { max_new_tokens = golden.max_new_tokens, pad_id = golden.pad_id }

    it('each prompt alone', function()
      for b, p in ipairs(golden.prompts) do same(generate.generate(model, { p }, base)[1], want.alone[b], 'prompt ' .. b) end
    end)

    it('the prompts as one left-padded batch', function()
      local rows = generate.generate(model, golden.prompts, base)
      for b = 1, #golden.prompts do same(rows[b], want.batch[b], 'batch row ' .. b) end
    end)

    it('with a repetition penalty', function()
      local o = { max_new_tokens = base.max_new_tokens, repetition_penalty = golden.repetition_penalty }
      for b, p in ipairs(golden.prompts) do
        same(generate.generate(model, { p }, o)[1], want.alone_penalized[b], 'penalised prompt ' .. b)
      end
    end)
  end)
end
