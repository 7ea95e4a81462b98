-- hub_spec.lua: the seed's data arguments (issue 18 item 4).
-- --dataset=c4 --dataset_config_name=en read the C4 shards from
-- $FSDP_DATA/c4/en/ (c4-train.* for training, c4-validation.* for
-- validation, as allenai/c4 names them) and --tokenizer=OWNER/NAME the
-- snapshot of the local Hugging Face cache; what is missing is one error
-- saying where it looked and the command that gets it, before a model is
-- built. Every corpus and cache here is generated in a temporary directory.
local T = require 'fsdp.testing'
local gen = require 'tests.data.corpus'
local tokenizer = require 'fsdp.data.tokenizer'

local tmp = T.tmpdir()
teardown(function() os.execute('rm -rf ' .. T.quote(tmp)) end)

local data, cache = tmp .. '/data', tmp .. '/hf/hub'
gen.write_c4(data .. '/c4/en', { shards = 2, documents = 40 })
gen.write_c4(data .. '/c4/en', { shards = 1, documents = 40, split = 'validation', seed = 7 })
gen.write_c4(data .. '/c4/realnewslike', { shards = 1, documents = 40, seed = 3 })
-- a hub cache as `huggingface-cli download tiny/gpt2-tok` leaves it
local snap = cache .. '/models--tiny--gpt2-tok/snapshots/0123abcd'
assert(os.execute(('mkdir -p %s/refs %s && cp tests/golden/tokenizers/gpt2_style.json %s/tokenizer.json '
  .. '&& printf 0123abcd > %s/refs/main'):format(T.quote(cache .. '/models--tiny--gpt2-tok'), T.quote(snap),
  T.quote(snap), T.quote(cache .. '/models--tiny--gpt2-tok'))) == 0)

local ENV = ('env FSDP_DATA=%s HF_HUB_CACHE=%s '):format(T.quote(data), T.quote(cache))
local SMALL = '--num_layers=1 --hidden_width=16 --num_heads=2 --seq_len=16 --train_batch_size=2 --max_steps=2 '
  .. '--warmup_steps=1 --validation_freq=2 --val_batches=2 --loader_threads=1'

local function recipe(env, args)
  local host = require 'fsdp.host'
  return T.sh(('%s timeout 120 %s recipes/llama2_7b.lua %s'):format(env, T.quote(host.exe), args))
end

local function has(out, needle) assert.truthy(out:find(needle, 1, true), ('%q not in:\n%s'):format(needle, out)) end

describe('the seed\'s --dataset, --dataset_config_name and --tokenizer', function()
  it('train on $FSDP_DATA/c4/en with a tokenizer from the Hugging Face cache', function()
    local out, rc = recipe(ENV, SMALL .. ' --dataset=c4 --dataset_config_name=en --tokenizer=tiny/gpt2-tok')
    assert.equal(0, rc, out)
    has(out, ('data: --dataset c4 (config en): 2 training shards in %s/c4/en, 1 validation shards'):format(data))
    has(out, 'Validation at batch 2')
    -- the tokenizer is the cached file's: its vocabulary sizes the model
    has(out, ('vocab %d'):format(tokenizer.load(snap .. '/tokenizer.json').vocab_size))
  end)

  it('take another config, and allenai/c4 as the name', function()
    local out, rc = recipe(ENV, SMALL .. ' --dataset=allenai/c4 --dataset_config_name=realnewslike')
    assert.equal(0, rc, out)
    has(out, ('data: --dataset allenai/c4 (config realnewslike): 1 training shards in %s/c4/realnewslike, no '
      .. 'c4-validation.*.json.gz shards: validating on --val_fraction 0.01'):format(data))
  end)

  it('say where they looked and how to get missing shards', function()
    local out, rc = recipe(('env FSDP_DATA=%s/none '):format(T.quote(tmp)), SMALL .. ' --dataset=c4 --dataset_config_name=en')
    assert.equal(2, rc, out)
    has(out, ('--dataset c4: allenai/c4 (config en) is not on this machine: no c4-train.*.json.gz in %s/none/c4/en')
      :format(tmp))
    has(out, ("huggingface-cli download allenai/c4 --repo-type dataset --local-dir %s/none/c4"):format(tmp))
    has(out, 'https://huggingface.co/datasets/allenai/c4/resolve/main/en/c4-train.00000-of-01024.json.gz')
    assert.is_nil(out:find('model:', 1, true), out) -- refused before a model is built
    -- FSDP_DATA unset: ~/.cache/fsdp-lua/data
    out, rc = recipe(('env -u FSDP_DATA HOME=%s/home '):format(T.quote(tmp)), SMALL .. ' --dataset=c4')
    assert.equal(2, rc, out)
    has(out, ('no c4-train.*.json.gz in %s/home/.cache/fsdp-lua/data/c4/en'):format(tmp))
  end)

  it('refuse a hub dataset they do not know, and a config without a dataset name', function()
    local out, rc = recipe(ENV, SMALL .. ' --dataset=wikitext')
    assert.equal(2, rc, out)
    has(out, '--dataset wikitext: no such file or directory, nor a Hugging Face dataset this build knows '
      .. '(allenai/c4, c4)')
    out, rc = recipe(ENV, SMALL .. ' --dataset_config_name=en')
    assert.equal(2, rc, out)
    has(out, '--dataset_config_name (en) names a config of a Hugging Face dataset given as --dataset')
  end)

  it('give tools/tokenize.lua the cached tokenizer too; a missing DIR/tokenizer.model is a missing file', function()
    gen.write(tmp .. '/c.txt', { documents = 20 })
    local host = require 'fsdp.host'
    local out, rc = T.sh(('%s timeout 120 %s tools/tokenize.lua --input=%s/c.txt --output=%s/tok '
      .. '--tokenizer=tiny/gpt2-tok'):format(ENV, T.quote(host.exe), tmp, tmp))
    assert.equal(0, rc, out)
    has(out, 'tokenizer: ')
    assert.equal(T.sh(('cat %s/tokenizer.json'):format(T.quote(snap))), T.sh(('cat %s/tok/tokenizer.json'):format(tmp)))
    T.raises(function() tokenizer.load('Llama-2-7b-hf/tokenizer.model') end,
      'Llama-2-7b-hf/tokenizer.model: no such file')
  end)

  it('name a hub tokenizer missing from the cache and the command that gets it', function()
    local out, rc = recipe(ENV, SMALL .. ' --dataset=c4 --tokenizer=nobody/no-tok')
    assert.equal(2, rc, out)
    has(out, ('nobody/no-tok is not a local file or directory, and the Hugging Face cache holds no tokenizer of it '
      .. '(looked in %s/models--nobody--no-tok/snapshots/'):format(cache))
    has(out, 'huggingface-cli download nobody/no-tok tokenizer.model tokenizer.json tokenizer_config.json')
  end)
end)
