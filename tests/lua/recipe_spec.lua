-- recipe_spec.lua: recipe options: typed --key=value overrides, flags,
-- --config files layered under the command line, clear errors, and the
-- recipes themselves end to end (dry run at full size; a short CPU run).
local recipe = require 'fsdp.recipe'
local T = require 'fsdp.testing'

local spec = {
  lr = { 3e-4, 'learning rate' },
  steps = { 10, 'steps' },
  dry_run = { false, 'dry run' },
  model = { 'tiny', 'model' },
}

describe('recipe options', function()
  it('are typed by their defaults', function()
    local cfg, rest = recipe.parse(spec, { '--lr=0.01', '--steps=3', '--dry-run', '--model=small', 'x' })
    assert.same({ lr = 0.01, steps = 3, dry_run = true, model = 'small' }, cfg)
    assert.same({ 'x' }, rest)
    assert.is_false(recipe.parse(spec, { '--dry_run=no' }).dry_run)
  end)

  it('layer a --config file under the command line', function()
    local path = os.tmpname()
    local f = io.open(path, 'w')
    f:write('return { lr = 0.5, steps = 7 }')
    f:close()
    local cfg = recipe.parse(spec, { '--config', path, '--steps=9' })
    assert.equals(0.5, cfg.lr)
    assert.equals(9, cfg.steps)
    os.remove(path)
  end)

  it('name what is wrong', function()
    assert.error_matches(function() recipe.parse(spec, { '--bogus=1' }) end,
      'unknown option %-%-bogus %(valid: dry_run, lr, model, steps%)')
    assert.error_matches(function() recipe.parse(spec, { '--lr=fast' }) end, '%-%-lr expects a number, got "fast"')
    assert.error_matches(function() recipe.parse(spec, { '--steps' }) end, '%-%-steps expects a value')
    assert.error_matches(function() recipe.parse(spec, { '--dry_run=maybe' }) end, 'expects true or false')
  end)
end)

describe('recipes/llama2_7b.lua', function()
  local function run(args) return T.run_script('recipes/llama2_7b.lua', args) end

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
    local command = text:match('srun [^\n]*llama2_7b%.lua(.-)"%$@"')
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
