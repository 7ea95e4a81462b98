-- options_spec.lua: recipe options: typed --key=value overrides, flags,
-- --config files layered under the command line, clear errors, and the
-- recipes themselves end to end (dry run at full size; a short CPU run).
local options = require 'fsdp.options'
local T = require 'fsdp.testing'

local spec = {
  lr = { 3e-4, 'learning rate' },
  steps = { 10, 'steps' },
  dry_run = { false, 'dry run' },
  model = { 'tiny', 'model' },
}

describe('recipe options', function()
  it('are typed by their defaults', function()
    local cfg, rest = options.parse(spec, { '--lr=0.01', '--steps=3', '--dry-run', '--model=small', 'x' }, 'x.lua', nil,
      { positional = 'X' })
    assert.same({ lr = 0.01, steps = 3, dry_run = true, model = 'small' }, cfg)
    assert.same({ 'x' }, rest)
    assert.is_false(options.parse(spec, { '--dry_run=no' }).dry_run)
  end)

  it('layer a --config file under the command line', function()
    local path = os.tmpname()
    local f = io.open(path, 'w')
    f:write('return { lr = 0.5, steps = 7 }')
    f:close()
    local cfg = options.parse(spec, { '--config', path, '--steps=9' })
    assert.equals(0.5, cfg.lr)
    assert.equals(9, cfg.steps)
    os.remove(path)
  end)

  it('name what is wrong', function()
    assert.error_matches(function() options.parse(spec, { '--bogus=1' }) end,
      'unknown option %-%-bogus %(valid: dry_run, lr, model, steps%)')
    assert.error_matches(function() options.parse(spec, { '--step=1' }) end,
      'unknown option %-%-step %(did you mean %-%-steps%?%)')
    assert.error_matches(function() options.parse(spec, { '--lr=fast' }) end, '%-%-lr expects a number, got "fast"')
    assert.error_matches(function() options.parse(spec, { '--steps' }) end, '%-%-steps expects a value')
    assert.error_matches(function() options.parse(spec, { '--dry_run=maybe' }) end, 'expects true or false')
  end)
end)

describe('option aliases', function()
  local S = {
    seq_len = { 128, 'tokens', int = true, min = 1, aliases = { 'max_context_width', 'ctx' } },
    model = { 'Llama-2-7b', 'model', one_of = { 'Llama-2-7b', 'tiny' }, aliases = { model_type = { llama_v2 = 'Llama-2-7b' } } },
    strategy = { 'FULL_SHARD', 'strategy', one_of = { 'FULL_SHARD', 'NO_SHARD' }, values = { full = 'FULL_SHARD' } },
    precision = { '', 'compute dtype', one_of = { '', 'bf16' }, aliases = { bf16 = { ['true'] = 'bf16', ['false'] = '' } } },
    dir = { '', 'checkpoints' },
    resume = { false, 'resume', needs = 'dir', values = function(text)
      if text == 'true' or text == 'false' then return nil end
      return true, { dir = text }
    end },
    steps = { 10, 'steps', int = true, min = 1 },
    warmup = { 2, 'warmup', int = true, min = 0, less_than = 'steps', aliases = { 'warmup_iters' } },
  }
  local function bad(args, text)
    assert.error_matches(function() options.parse(S, args) end, text, nil, true)
  end

  it('set the option, translating values', function()
    local cfg = options.parse(S, { '--max_context_width=64', '--model_type=llama_v2', '--strategy=full', '--bf16' })
    assert.equals(64, cfg.seq_len)
    assert.equals('Llama-2-7b', cfg.model)
    assert.equals('FULL_SHARD', cfg.strategy)
    assert.equals('bf16', cfg.precision)
    assert.equals('', options.parse(S, { '--bf16=false' }).precision)
    assert.equals('FULL_SHARD', options.parse(S, { '--strategy=FULL' }).strategy)
    assert.equals(32, options.parse(S, { '--ctx=32' }).seq_len)
  end)

  it('may imply other options (--resume=DIR)', function()
    local cfg = options.parse(S, { '--resume=./ck' })
    assert.is_true(cfg.resume)
    assert.equals('./ck', cfg.dir)
    cfg = options.parse(S, { '--dir=./ck', '--resume=./ck' })
    assert.is_true(cfg.resume)
    assert.is_true(options.parse(S, { '--dir=x', '--resume' }).resume)
    bad({ '--dir=./a', '--resume=./b' }, '--resume=./b and --dir=./a disagree: give one of them')
    -- in a --config file too; the command line still overrides a file's value under another name
    local path = os.tmpname()
    local f = io.open(path, 'w')
    f:write("return { resume = './ck', max_context_width = 64 }")
    f:close()
    cfg = options.parse(S, { '--config', path, '--seq_len=32' })
    os.remove(path)
    assert.is_true(cfg.resume)
    assert.equals('./ck', cfg.dir)
    assert.equals(32, cfg.seq_len)
  end)

  it('are checked under the name the user wrote', function()
    bad({ '--max_context_width=0' }, '--max_context_width must be >= 1, got 0')
    bad({ '--max_context_width=abc' }, '--max_context_width expects a number, got "abc"')
    bad({ '--steps=2', '--warmup_iters=5' }, '--warmup_iters (5) must be less than --steps (2)')
    bad({ '--model_type=gpt2' }, "--model_type must be one of llama_v2; got 'gpt2'")
    bad({ '--strategy=hybrid' }, "--strategy must be one of FULL_SHARD, NO_SHARD; got 'hybrid'")
    bad({ '--seq_len=8', '--ctx=16' }, '--seq_len and --ctx are the same option (seq_len): give it once')
    bad({ '--max_contxt_width=1' }, 'unknown option --max_contxt_width (did you mean --max_context_width?)')
    bad({ '--model_type' }, '--model_type expects a value')
  end)

  it('are listed by --help, and a clash with an option is a spec error', function()
    local usage = options.usage(S, 'x.lua')
    assert.matches('alias --max_context_width\n', usage, 1, true)
    assert.matches("alias --model_type (llama_v2 -> 'Llama-2-7b')", usage, 1, true)
    assert.matches('also full', usage, 1, true)
    assert.error_matches(function()
      options.parse({ a = { 1, 'a', aliases = { 'b' } }, b = { 2, 'b' } }, {})
    end, 'alias b of a is also an option', nil, true)
  end)
end)

describe('option constraints', function()
  local files = require 'fsdp.io.files'
  local S = {
    batch_size = { 4, 'batch', int = true, min = 1 },
    lr = { 1e-3, 'lr', positive = true },
    min_lr = { 0, 'final lr', min = 0, at_most = 'lr' },
    beta = { 0.9, 'beta', min = 0, below = 1 },
    noise = { 0.1, 'noise', max = 1 },
    steps = { 10, 'steps', int = true, min = 1 },
    warmup = { 2, 'warmup', int = true, min = 0, less_than = 'steps' },
    width = { 0, 'width (0: keep)', int = true, min = 0, multiple_of = 'heads' },
    heads = { 0, 'heads (0: keep)', int = true, min = 0 },
    dtype = { 'f32', 'dtype', one_of = { 'f32', 'bf16' } },
    strategy = { 'FULL_SHARD', 'strategy', one_of = function() return { 'FULL_SHARD', 'NO_SHARD' } end },
    ckpt_dir = { '', 'checkpoints', output = 'dir' },
    ckpt_freq = { 0, 'save every', int = true, min = 0, needs = 'ckpt_dir' },
    out = { '', 'output file', output = 'file' },
    data = { '', 'input', input = 'dir' },
    odd = { 1, 'an odd number', check = function(v) if v % 2 == 0 then return 'must be odd, got ' .. v end end },
  }
  local function bad(args, pattern)
    assert.error_matches(function() options.parse(S, args) end, pattern, nil, true)
  end

  it('check integers, ranges and finite numbers', function()
    assert.equals(8, options.parse(S, { '--batch_size=8' }).batch_size)
    bad({ '--batch_size=0' }, '--batch_size must be >= 1, got 0')
    bad({ '--batch_size=1.5' }, '--batch_size must be an integer, got 1.5')
    bad({ '--lr=0' }, '--lr must be > 0, got 0')
    bad({ '--lr=-inf' }, '--lr must be a finite number, got -inf')
    bad({ '--beta=1' }, '--beta must be < 1, got 1')
    bad({ '--noise=1.5' }, '--noise must be <= 1, got 1.5')
    bad({ '--odd=2' }, '--odd must be odd, got 2')
  end)

  it('check enums with a suggestion', function()
    bad({ '--dtype=f8' }, "--dtype must be one of f32, bf16; got 'f8'")
    bad({ '--dtype=bf61' }, "got 'bf61' (did you mean bf16?)")
    bad({ '--strategy=FULL' }, "--strategy must be one of FULL_SHARD, NO_SHARD; got 'FULL' (did you mean FULL_SHARD?)")
    bad({ '--strategy=full_shard' }, '(did you mean FULL_SHARD?)')
    bad({ '--batchsize=2' }, 'unknown option --batchsize (did you mean --batch_size?)')
  end)

  it('check relations when both options are set', function()
    bad({ '--warmup=10', '--steps=3' }, '--warmup (10) must be less than --steps (3)')
    assert.equals(0, options.parse(S, { '--warmup=0', '--steps=1' }).warmup)
    bad({ '--min_lr=0.1' }, '--min_lr (0.1) must be at most --lr (0.001)')
    bad({ '--width=10', '--heads=4' }, '--width (10) must be a multiple of --heads (4)')
    assert.equals(10, options.parse(S, { '--width=10' }).width)  -- heads 0: the model's, checked there
    bad({ '--ckpt_freq=5' }, '--ckpt_freq needs --ckpt_dir')
  end)

  it('check paths: inputs exist, output directories are created and writable', function()
    local dir = T.tmpdir()
    bad({ '--data=' .. dir .. '/none' }, '--data: ' .. dir .. '/none does not exist')
    local cfg = options.parse(S, { '--ckpt_dir=' .. dir .. '/c/d', '--ckpt_freq=5', '--out=' .. dir .. '/e/f.bin',
                                  '--data=' .. dir })
    assert.equals(5, cfg.ckpt_freq)
    assert.equals('directory', files.mode(dir .. '/c/d'))
    assert.equals('directory', files.mode(dir .. '/e'))
    assert.is_nil(files.mode(dir .. '/e/f.bin'))
    bad({ '--out=' .. dir }, '--out: ' .. dir .. ' is a directory, not a file')
    bad({ '--ckpt_dir=/proc/x' }, '--ckpt_dir: cannot create directory /proc/x')
    bad({ '--out=/proc/y.bin' }, '--out: cannot write in /proc')
    os.execute('rm -rf ' .. T.quote(dir))
  end)

  it('run the recipe\'s own check after its options, as option errors', function()
    local function check(cfg)
      if cfg.width > 0 and cfg.width < 8 then error('models/x.lua:3: x config: dim ' .. cfg.width .. ' too small', 0) end
    end
    assert.error_matches(function() options.parse(S, { '--width=4' }, 'x', check) end,
      '^x config: dim 4 too small$')
    assert.equals('x config: dim 4 too small (from --width)',
      options.explain('models/x.lua:3: x config: dim 4 too small', { dim = 'width', heads = 'heads' }))
    local _, _, only = options.parse(S, { '--validate_options' }, 'x', check)
    assert.is_true(only)
  end)

  it('refuse a misspelt constraint in a spec', function()
    assert.error_matches(function() options.parse({ n = { 1, 'n', minimum = 1 } }, {}) end,
      'spec entry n: unknown constraint minimum', nil, true)
  end)

  it('show in --help', function()
    local usage = options.usage(S, 'x.lua')
    assert.matches('--batch_size%s+4%s+batch %[integer >= 1%]', usage)
    assert.matches('--warmup%s+2%s+warmup %[integer >= 0; < %-%-steps%]', usage)
    assert.matches('--dtype%s+f32%s+dtype %[one of f32, bf16%]', usage)
  end)
end)

describe('fsdp.suggest', function()
  local suggest = require 'fsdp.suggest'
  it('suggests a close name, a unique prefix or another case, and nothing far off', function()
    assert.equals(3, suggest.distance('kitten', 'sitting'))
    assert.equals('num_layers', suggest.closest('num_layer', { 'num_heads', 'num_layers' }))
    assert.equals('FULL_SHARD', suggest.closest('FULL', { 'FULL_SHARD', 'NO_SHARD' }))
    assert.equals('FULL_SHARD', suggest.closest('full_shard', { 'FULL_SHARD', 'NO_SHARD' }))
    assert.equals(1, suggest.distance('bf61', 'bf16'))
    assert.is_nil(suggest.closest('S', { 'SHARD_GRAD_OP', 'SHARD_X' }))  -- no unique prefix, nothing close
    assert.is_nil(suggest.closest('bogus', { 'batch_size', 'lr' }))
    assert.equals('', suggest.hint('zzz', { 'lr' }))
  end)

  -- issue 41: --model=llama3-8b suggested Llama-2-7b
  it('knows a model name\'s family and generation from its letters and digits', function()
    local names = { 'Llama-2-7b', 'Llama-2-13b', 'Llama-3.1-8B', 'Llama-3.2-1B', 'Qwen3-8B', 'qwen3-tiny' }
    assert.equals('Llama-3.1-8B', suggest.closest('llama3-8b', names))
    assert.equals('Llama-3.1-8B', suggest.closest('Llama-3-8B', names))
    assert.equals('Llama-2-7b', suggest.closest('llama2_7b', names))
    assert.equals('Qwen3-8B', suggest.closest('qwen3-8b', names))
  end)
end)

describe('model config overrides', function()
  it('refuse unknown keys with a suggestion, and bad shapes', function()
    local llama, gpt2, t5 = require 'models.llama', require 'models.gpt2', require 'models.t5'
    local deepvit, mnist = require 'models.deepvit', require 'models.mnist'
    assert.error_matches(function() llama.build('tiny', { device = 'meta', num_layer = 3 }) end,
      "llama: unknown config key 'num_layer' (did you mean num_layers?)", nil, true)
    assert.error_matches(function() llama.config('tiny', { n_layers = -1 }) end,
      'llama config: n_layers must be a positive integer, got -1', nil, true)
    assert.error_matches(function() llama.config('tiny', { dim = 64.5 }) end, 'dim must be a positive integer')
    assert.error_matches(function() gpt2.config('tiny', { n_layer = 2, drop = 0.1 }) end,
      "gpt2: unknown config key 'drop'", nil, true)
    assert.error_matches(function() gpt2.config('tiny', { dropout = 1.5 }) end, 'dropout must be in [0, 1)', nil, true)
    assert.error_matches(function() t5.config('tiny', { d_modle = 8 }) end,
      "t5: unknown config key 'd_modle' (did you mean d_model?)", nil, true)
    assert.error_matches(function() deepvit.config('tiny', { heads = 0 }) end, 'heads must be a positive integer')
    assert.error_matches(function() deepvit.config('tiny', { head = 2 }) end, "(did you mean heads?)", nil, true)
    assert.error_matches(function() mnist.build({ devcie = 'meta' }) end, "(did you mean device?)", nil, true)
    assert.error_matches(function() llama.config('Llama-2-7') end, "unknown config 'Llama-2-7' (did you mean Llama-2-7b?)",
      nil, true)
    -- The spellings that are right still work.
    assert.equals(3, llama.config('tiny', { num_layers = 3 }).n_layers)
    assert.equals(3, gpt2.config('tiny', { n_layer = 3 }).n_layers)
  end)
end)

describe('recipes/llama2_7b.lua', function()
  local function run(args) return T.run_script('recipes/llama2_7b.lua', args) end

  it('plans for another world with --plan_world and --plan_nodes, with the accumulation buffers', function()
    local out, rc = run('--plan --plan_world=16 --plan_nodes=2 --plan_device=h100-80g --sharding_strategy=hybrid '
      .. '--bf16 --grad_accum_steps=4')
    assert.equals(0, rc, out)
    assert.matches('16 x h100-80g (2 nodes of 8), HYBRID_SHARD, params f32, compute bf16', out, 1, true)
    -- 6,738,415,616 parameters unsharded in bf16: 12.551 GiB on every rank
    assert.matches('gradient accumulation buffers%s+12%.551%s+%(unsharded, 4 micro%-batches per step%)', out)
    out = run('--plan --plan_world=16 --plan_device=h100-80g')
    assert.matches('16 x h100-80g (2 nodes of 8), FULL_SHARD', out, 1, true) -- the profile's node size
    assert.is_nil(out:find('accumulation', 1, true))
  end)

  it('builds the full 7B on meta with --dry-run and prints its parameters', function()
    local out, rc = run('--dry-run')
    assert.equals(0, rc)
    assert.matches('parameters: 6,738,415,616', out, 1, true)
    assert.matches('cpu memory in use: 0 bytes', out, 1, true)
    assert.matches('%(0%-31%): 32 x LlamaDecoderLayer', out)
  end)

  it('trains a reduced model on CPU and logs each step in the seed format', function()
    local out, rc = run('--num_layers=1 --hidden_width=32 --num_heads=2 --vocab_size=64 --seq_len=16 '
      .. '--batch_size=2 --max_steps=3 --warmup_steps=1')
    assert.equals(0, rc, out)
    assert.matches('Batch 3 Loss: [%d.]+, Speed: [%d.]+ samples/sec, lr: [%d.e%-+]+', out)
  end)

  it('accepts every option recipes/llama2_7b.sbatch passes (checkpointing and resuming)', function()
    local f = assert(io.open(require('fsdp.host').root .. '/recipes/llama2_7b.sbatch'))
    local text = f:read('*a')
    f:close()
    local command = text:match('srun [^\n]*llama2_7b%.lua"?(.-)"%$@"')
    assert.is_not_nil(command, 'the srun line of the sbatch script')
    local opts = {}
    for opt in command:gmatch('%-%-[%w_]+') do opts[#opts + 1] = opt end
    for _, needed in ipairs({ '--checkpoint_dir', '--checkpoint_freq', '--resume_from_checkpoint' }) do
      assert.truthy(command:find(needed, 1, true), needed)
    end
    -- Values from the job's environment become placeholders (paths in a
    -- temporary directory: output directories are created as the options
    -- are checked, and --data must exist); --dry-run then parses them all
    -- without training.
    local dir = T.tmpdir()
    local args = command:gsub('\\\n', ' '):gsub('"%$%b{}[^"]*"', dir .. '/x'):gsub('%-%-data=%S+', '--data=' .. dir)
      :gsub('%-%-checkpoint_dir=%S+', '--checkpoint_dir=' .. dir .. '/checkpoints')
    local out, rc = run(args .. ' --dry-run')
    os.execute('rm -rf ' .. T.quote(dir))
    assert.equals(0, rc, out)
    assert.is_true(#opts >= 10)
  end)

  it('rejects an unknown option with status 2 and the list of valid ones', function()
    local out, rc = run('--bogus=1')
    assert.equals(2, rc)
    assert.matches('unknown option %-%-bogus %(valid: activation_checkpointing', out)
  end)
end)

describe('recipes/deepvit_8b.lua and recipes/mnist.lua', function()
  local run = T.run_script

  it('build DeepViT 8B and the MNIST CNN at full size on meta', function()
    local out, rc = run('recipes/deepvit_8b.lua', '--dry-run')
    assert.equals(0, rc, out)
    assert.matches('parameters: 8007494160', out, 1, true)
    out, rc = run('recipes/mnist.lua', '--dry-run')
    assert.equals(0, rc, out)
    assert.matches('parameters: 1199882', out, 1, true)
  end)

  it('train reduced DeepViT with checkpointing and AnyPrecisionAdamW, and MNIST, on CPU', function()
    local out, rc = run('recipes/deepvit_8b.lua', '--depth=1 --dim=32 --heads=2 --mlp_dim=64 --image_size=32 '
      .. '--num_classes=4 --max_steps=3 --batch_size=2 --activation_checkpointing --optimizer=anyprecision')
    assert.equals(0, rc, out)
    assert.matches('Batch 3 Loss: ', out, 1, true)
    out, rc = run('recipes/mnist.lua', '--epochs=1 --train_size=128 --test_size=64 --max_batches=2')
    assert.equals(0, rc, out)
    assert.matches('Test set: Average loss: [%d.]+, Accuracy: %d+/64', out)
  end)
end)

-- issue 41: command-line words ([Note: command-line words] in fsdp.options)
describe('command-line words', function()
  local S = {
    lr = { 3e-4, 'learning rate' },
    steps = { 10, 'steps', int = true, min = 1 },
    dry_run = { false, 'dry run' },
    no_cache = { false, 'an option whose name starts with no_' },
    model = { 'tiny', 'model' },
    precision = { '', 'compute dtype', aliases = { bf16 = { ['true'] = 'bf16', ['false'] = '' } } },
  }
  local function bad(args, text, opts)
    local ok, err = pcall(options.parse, S, args, 'x.lua', nil, opts)
    assert.is_false(ok)
    assert.equals(text, err)
  end

  it('take --key value as --key=value, --no-flag as --flag=false', function()
    local cfg = options.parse(S, { '--model', 'small', '--lr', '-0.5', '--steps', '3', '--dry-run' })
    assert.same({ lr = -0.5, steps = 3, dry_run = true, no_cache = false, model = 'small', precision = '' }, cfg)
    assert.is_false(options.parse(S, { '--dry_run', '--no-dry-run' }).dry_run)
    assert.is_false(options.parse(S, { '--no_dry_run' }).dry_run)
    assert.is_true(options.parse(S, { '--no-cache' }).no_cache) -- an option of that name wins
    assert.equals('', options.parse(S, { '--bf16', '--no-bf16' }).precision)
    assert.equals('', options.parse(S, { '--model', '' }).model)
  end)

  it('refuse a word that is not an option in one line', function()
    bad({ 'model=tiny' }, 'model=tiny is not an option (did you mean --model=tiny?)')
    bad({ '-model=tiny' }, '-model=tiny is not an option (did you mean --model=tiny?)')
    bad({ 'modle=tiny' }, 'modle=tiny is not an option (did you mean --model=tiny?)')
    bad({ '-dry-run' }, '-dry-run is not an option (did you mean --dry-run?)')
    bad({ '-zzz' }, 'unknown option -zzz (options start with --; --help lists them)')
    bad({ '--dry_run', 'false' },
      "unexpected argument 'false' after --dry_run, which takes no value (did you mean --dry_run=false?)")
    bad({ 'tiny' },
      "unexpected argument 'tiny': x.lua takes options only (--key=value or --key value; --help lists them)")
    bad({ '--steps' }, '--steps expects a value (--steps=VALUE or --steps VALUE)')
    bad({ '--steps', '--lr=1' }, '--steps expects a value (--steps=VALUE or --steps VALUE)')
    bad({ '--config' }, '--config expects a file (--config=FILE.yaml, --config FILE.lua)')
    -- a script that declares positional arguments takes them (and still refuses dashes it does not know)
    local _, rest = options.parse(S, { 'a', '--lr', '1', 'b', '-' }, 'x.lua', nil, { positional = 'FILE ...' })
    assert.same({ 'a', 'b', '-' }, rest)
    bad({ '-model=tiny' }, '-model=tiny is not an option (did you mean --model=tiny?)', { positional = 'FILE' })
  end)

  it('list the forms and the positional arguments in --help', function()
    local text = options.usage(S, 'x.lua', { positional = 'FILE ...' })
    assert.matches('^usage: fsdp%-lua x%.lua %[%-%-key=value | %-%-key value | %-%-flag | %-%-no%-flag %.%.%.%] '
      .. '%[%-%-config FILE%.yaml|%.lua%] FILE %.%.%.\n', text)
    assert.matches('--print_config', text, 1, true)
  end)
end)

-- issue 41: [Note: config files] in fsdp.config_file
describe('--config files', function()
  local S = {
    lr = { 3e-4, 'learning rate', positive = true },
    steps = { 10, 'steps', int = true, min = 1 },
    dry_run = { false, 'dry run' },
    model = { 'tiny', 'model' },
    seq_len = { 128, 'tokens', aliases = { 'max_context_width' } },
  }
  local dir
  setup(function() dir = T.tmpdir() end)
  teardown(function() os.execute('rm -rf ' .. T.quote(dir)) end)
  local function file(name, text)
    local path = dir .. '/' .. name
    local f = assert(io.open(path, 'w'))
    f:write(text)
    f:close()
    return path
  end
  local function bad(args, text)
    local ok, err = pcall(options.parse, S, args, 'x.lua')
    assert.is_false(ok)
    assert.equals(text, err)
  end

  it('take YAML, flat or in sections one level deep, under the command line', function()
    local path = file('a.yaml', 'model: 7\ntraining:\n  lr: 1e-4\n  steps: 5\ndata: {max_context_width: 64}\n'
      .. 'dry_run: yes\n')
    local cfg = options.parse(S, { '--config', path, '--steps', '9' })
    assert.same({ lr = 1e-4, steps = 9, dry_run = true, model = '7', seq_len = 64 }, cfg)
    -- Lua files take sections too
    cfg = options.parse(S, { '--config=' .. file('b.lua', 'return { optim = { lr = 0.5 }, steps = 7 }') })
    assert.equals(0.5, cfg.lr)
    assert.equals(7, cfg.steps)
  end)

  it('refuse what they cannot set in one line naming the key as written', function()
    local p = file('c.yaml', 'training:\n  lrr: 1e-4\n')
    bad({ '--config', p }, '--config ' .. p .. ': unknown option training.lrr (did you mean lr?)')
    p = file('d.yaml', 'lr: 1\ntraining: {lr: 2}\n')
    bad({ '--config', p }, '--config ' .. p .. ': lr and training.lr set the same option: give it once')
    p = file('e.yaml', 'a:\n  b:\n    lr: 1\n')
    bad({ '--config', p }, '--config ' .. p .. ': a.b: sections nest one level (training: {lr: 1e-4} sets lr)')
    p = file('f.yaml', 'steps:\n')
    bad({ '--config', p }, '--config ' .. p .. ': steps has no value')
    p = file('g.yaml', 'training: {steps: 2.5}\n')
    bad({ '--config', p }, '--steps must be an integer, got 2.5')
    p = file('h.yaml', 'training: {steps: many}\n')
    bad({ '--config', p }, '--config ' .. p .. ': training.steps: --steps expects a number, got "many"')
    p = file('i.yaml', '- lr\n')
    bad({ '--config', p }, '--config ' .. p .. ': must hold a mapping of options (key: value), not a list')
    p = file('j.lua', 'lr: 1\n')
    local ok, err = pcall(options.parse, S, { '--config', p })
    assert.is_false(ok)
    assert.matches('(a YAML file must end in .yaml or .yml)', err, 1, true)
  end)

  it('round-trip the resolved config: printed compactly, saved as YAML that --config reads', function()
    local cfg = options.parse(S, { '--lr=0.0003000001', '--model', 'a "quoted" name/x', '--steps=3' }, 'x.lua')
    assert.same({ 'lr', 'model', 'steps' }, options.changed(cfg))
    assert.equals('  lr = 0.0003000001\n  model = a "quoted" name/x\n  steps = 3\n'
      .. '  (2 other options at their defaults: --print_config lists them all)', options.format(cfg))
    assert.equals('  (all 5 options at their defaults: --print_config lists them)',
      options.format((options.parse(S, {}))))
    local path, script = options.save_config(cfg, dir)
    assert.equals(dir .. '/config.yaml', path)
    assert.equals('x.lua', script)
    assert.same(cfg, options.parse(S, { '--config', path }))
    assert.equals('dry_run: false\nlr: 0.0003000001\nmodel: "a \\"quoted\\" name/x"\nseq_len: 128\nsteps: 3',
      options.dump(cfg, true))
  end)
end)
