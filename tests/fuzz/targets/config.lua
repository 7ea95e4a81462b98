-- The translation of a downloaded model's JSON configs: one input is
-- written as a Hugging Face directory's config.json and read by
-- models/hf.lua (every family's key map and checks, before anything is
-- built), and as a PEFT adapter directory's adapter_config.json loaded by
-- fsdp.lora.load_peft onto a tiny Llama on meta (its numbers, targets and
-- rank checks; the adapter weights are the stored golden file). A refusal
-- must be the readers' own one line naming the file: an error that is a
-- Lua fault ("attempt to index", "bad argument", ...) or that names no
-- file aborts, which the fuzzer reports as a crash.
local hf = require 'models.hf'
local lora = require 'fsdp.lora'
local llama = require 'models.llama'
local ffi = require 'ffi'
pcall(ffi.cdef, 'void abort(void);')

-- tests/fuzz/run.sh gives a work directory it removes afterwards.
local dir = os.getenv('FUZZ_WORKDIR')
if not dir then
  dir = os.tmpname()
  os.remove(dir)
end
local hf_dir, peft_dir = dir .. '/config', dir .. '/adapter'
assert(os.execute("mkdir -p '" .. hf_dir .. "' '" .. peft_dir .. "'") == 0)
-- (fuzz_lua runs in the project's root)
local weights = assert(io.open('tests/golden/hf/lora/llama/adapter_model.safetensors', 'rb')):read('*a')
local w = assert(io.open(peft_dir .. '/adapter_model.safetensors', 'wb'))
w:write(weights)
w:close()

local FAULTS = { 'attempt to ', 'bad argument', 'stack overflow', 'table index is', 'C stack overflow',
                 'not enough memory', 'got table: 0x', 'function: 0x' }

local function check(ok, err, file)
  if ok then return end
  local msg = tostring(err)
  for _, f in ipairs(FAULTS) do
    if msg:find(f, 1, true) then
      io.stderr:write('fuzz config: a fault, not a refusal: ', msg, '\n')
      ffi.C.abort()
    end
  end
  if not msg:find(file, 1, true) then
    io.stderr:write('fuzz config: the refusal does not name ', file, ': ', msg, '\n')
    ffi.C.abort()
  end
end

return function(path)
  local src = assert(io.open(path, 'rb'))
  local text = src:read('*a')
  src:close()
  for _, target in ipairs({ hf_dir .. '/config.json', peft_dir .. '/adapter_config.json' }) do
    local f = assert(io.open(target, 'wb'))
    f:write(text)
    f:close()
  end
  check(pcall(hf.read_config, hf_dir), 'config.json')
  local model = llama.CausalLM(llama.config('tiny', { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2,
    ffn_dim = 48, vocab_size = 64 }), { device = 'meta' })
  check(pcall(lora.load_peft, model, peft_dir), 'adapter_config.json')
end
