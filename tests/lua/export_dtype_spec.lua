-- export_dtype_spec.lua: the dtype of what an export writes ([Note:
-- export dtype] in models/hf.lua): save_pretrained's dtype converts every
-- tensor and config.json's dtype / torch_dtype name it; --export_dtype
-- (recipes and tools/export.lua) is auto (the dtype the --init_from
-- Hugging Face directory names, also through a checkpoint of its run;
-- else the trained parameters'), f32 or bf16. A bf16 directory loaded and
-- exported again is the same bf16 bits.
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'
local hf = require 'models.hf'
local json = require 'fsdp.io.json'
local files = require 'fsdp.io.files'
local host = require 'fsdp.host'

local GOLDEN = host.root .. '/tests/golden/hf/'
local tmp = T.tmpdir()
teardown(function() os.execute('rm -rf ' .. T.quote(tmp)) end)
local n = 0
local function dir()
  n = n + 1
  return ('%s/d%d'):format(tmp, n)
end

local function config(d) return json.decode(files.read(d .. '/config.json')) end

-- name -> {dtype, bytes as a list of numbers} of every tensor of a directory's model.safetensors
local function tensors(d)
  local f = fsdp.safetensors.open(d .. '/model.safetensors')
  local out = {}
  for _, name in ipairs(f:names()) do
    local t = f:get(name)
    out[name] = { dtype = t.dtype, values = t:float():contiguous():view(-1):tolist() }
  end
  f:close()
  return out
end

local function dtypes_of(d)
  local seen = {}
  for _, t in pairs(tensors(d)) do seen[t.dtype] = true end
  local list = {}
  for k in pairs(seen) do list[#list + 1] = k end
  table.sort(list)
  return list
end

-- A bf16 copy of the golden Llama 3 directory (written by save_pretrained).
local bf16_dir = dir()
hf.save_pretrained(hf.from_pretrained(GOLDEN .. 'llama3_tiny_v5', { dtype = 'f32' }), bf16_dir, { dtype = 'bf16' })

describe('the dtype of an export', function()
  it('save_pretrained converts to the dtype asked for, and config.json names it', function()
    local h = config(bf16_dir)
    assert.equals('bfloat16', h.dtype)
    assert.equals('bfloat16', h.torch_dtype)
    assert.same({ 'bf16' }, dtypes_of(bf16_dir))
    -- the values are the f32 ones rounded to bf16
    local src, got = tensors(GOLDEN .. 'llama3_tiny_v5'), tensors(bf16_dir)
    for name, t in pairs(got) do
      local want = fsdp.tensor(src[name].values):bfloat16():float():tolist()
      assert.same(want, t.values, name)
    end
    assert.equals('bf16', hf.source_dtype(bf16_dir))
    assert.equals('f32', hf.source_dtype(GOLDEN .. 'llama2_tiny'))
    assert.error_matches(function() hf.save_pretrained(hf.from_pretrained(bf16_dir), dir(), { dtype = 'i32' }) end,
      'dtype i32 is not one a Hugging Face directory holds')
  end)

  it('a bf16 directory loaded in f32 and exported with auto is the same bf16 bits', function()
    local pretrained = require 'models.pretrained'
    local src = pretrained.open(bf16_dir)
    assert.equals('bf16', pretrained.export_dtype('auto', src))
    assert.equals('f32', pretrained.export_dtype('f32', src))
    local model = hf.from_pretrained(bf16_dir, { dtype = 'f32' })
    local out = dir()
    hf.save_pretrained(model, out, { dtype = pretrained.export_dtype('auto', src) })
    assert.same(tensors(bf16_dir), tensors(out))
    assert.equals('bfloat16', config(out).dtype)
    -- without a dtype: each parameter's own (f32 here), as before
    local plain = dir()
    hf.save_pretrained(model, plain)
    assert.same({ 'f32' }, dtypes_of(plain))
    assert.equals('float32', config(plain).torch_dtype)
  end)

  it('--export_dtype in a recipe and in tools/export.lua: auto follows --init_from, also through the checkpoint',
    function()
      local d = dir()
      local out, rc = T.run_script('recipes/llama2_7b.lua', ('--init_from=%s --max_steps=2 --warmup_steps=1 '
        .. '--seq_len=8 --batch_size=2 --export_hf=%s/hf --checkpoint_dir=%s/ckpt --checkpoint_freq=2')
        :format(bf16_dir, d, d))
      assert(rc == 0, out)
      assert.matches('in bf16', out, 1, true)
      assert.same({ 'bf16' }, dtypes_of(d .. '/hf'))
      assert.equals('bfloat16', config(d .. '/hf').dtype)
      out, rc = T.run_script('tools/export.lua', ('%s/ckpt %s/auto'):format(d, d))
      assert(rc == 0, out)
      assert.same({ 'bf16' }, dtypes_of(d .. '/auto'))
      -- the checkpoint's export in bf16 is the recipe's export
      assert.same(tensors(d .. '/hf'), tensors(d .. '/auto'))
      out, rc = T.run_script('tools/export.lua', ('%s/ckpt %s/f32 --export_dtype=f32'):format(d, d))
      assert(rc == 0, out)
      assert.same({ 'f32' }, dtypes_of(d .. '/f32'))
      assert.equals('float32', config(d .. '/f32').torch_dtype)
      out, rc = T.run_script('recipes/llama2_7b.lua', ('--init_from=%s --max_steps=2 --warmup_steps=1 '
        .. '--seq_len=8 --batch_size=2 --export_hf=%s/f32hf --export_dtype=bf16'):format(GOLDEN .. 'llama2_tiny', d))
      assert(rc == 0, out)
      assert.same({ 'bf16' }, dtypes_of(d .. '/f32hf'))
      out, rc = T.run_script('recipes/llama2_7b.lua', '--export_dtype=f16')
      assert.equals(2, rc, out)
      assert.matches('export_dtype', out, 1, true)
    end)
end)
