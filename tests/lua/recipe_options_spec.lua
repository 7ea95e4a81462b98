-- recipe_options_spec.lua: every recipe run as a process with bad options
-- (issue 15's list and more): each is refused with exit status 2 and one
-- line on stderr naming the option, before anything is built (nothing on
-- stdout: the recipes print their config only after the checks) and fast;
-- the fit check refuses the default 7B recipe with the planner's numbers;
-- output paths are created and probed at start; --nproc is bounded before
-- mpirun starts.
local T = require 'fsdp.testing'
local clock = require 'fsdp.clock'
local files = require 'fsdp.io.files'
local host = require 'fsdp.host'

local tmp
setup(function() tmp = T.tmpdir() end)
teardown(function() if tmp then os.execute('rm -rf ' .. T.quote(tmp)) end end)

-- Run `fsdp-lua <args>` from the project root with stdout and stderr
-- apart: exit status, stdout, stderr, seconds.
local function run(args, env, seconds)
  local err = os.tmpname()
  local cmd = ('cd %s && %s timeout %d %s %s 2>%s; echo "@rc=$?"'):format(T.quote(host.root), env or '',
    seconds or 120, T.quote(host.exe), args, T.quote(err))
  local t0 = clock.now()
  local p = assert(io.popen(cmd))
  local out = p:read('*a')
  p:close()
  local dt = clock.now() - t0
  local stdout, rc = out:match('^(.-)@rc=(%d+)\n?$')
  local stderr = files.read(err) or ''
  os.remove(err)
  return tonumber(rc), stdout, stderr, dt
end

local SMALL = '--num_layers=1 --hidden_width=32 --num_heads=2 --vocab_size=64 --seq_len=16 --batch_size=2'

-- {recipe and options, what the one line says}. TMP in an option is the
-- spec's temporary directory.
local CASES = {
  -- issue 15's list
  { 'recipes/llama2_7b.lua --batch_size=0', '--batch_size must be >= 1, got 0' },
  { 'recipes/llama2_7b.lua --vocab_size=-5', '--vocab_size must be >= 0, got -5' },
  { 'recipes/llama2_7b.lua --num_layers=-1', '--num_layers must be >= 0, got -1' },
  { 'recipes/llama2_7b.lua --hidden_width=-8', '--hidden_width must be >= 0, got -8' },
  { 'recipes/llama2_7b.lua --grad_clip=-1', '--grad_clip must be >= 0, got -1' },
  { 'recipes/llama2_7b.lua --max_steps=3', '--warmup_steps (10) must be less than --max_steps (3)' },
  { 'recipes/llama2_7b.lua --dtype=f8', "--dtype must be one of f32, bf16; got 'f8'" },
  -- issue 38: what the optimizers cannot update is not offered
  { 'recipes/llama2_7b.lua --dtype=f64', "--dtype must be one of f32, bf16; got 'f64'" },
  { 'recipes/t5_3b.lua --dtype=f64', "--dtype must be one of f32, bf16; got 'f64'" },
  { 'recipes/llama2_7b.lua --sharding_strategy=FULL_SHAD', "got 'FULL_SHAD' (did you mean FULL_SHARD?)" },
  { 'recipes/llama2_7b.lua --checkpoint_dir=/proc/fsdp-ckpt', '--checkpoint_dir: cannot create directory /proc/fsdp-ckpt' },
  { 'recipes/llama2_7b.lua --checkpoint_dir=/etc/passwd', '--checkpoint_dir: /etc/passwd exists and is not a directory' },
  { 'recipes/llama2_7b.lua --save_full_state_dict=/proc/nope/model.safetensors',
    '--save_full_state_dict: cannot create directory /proc/nope' },
  { 'recipes/llama2_7b.lua --save_full_state_dict=TMP', '--save_full_state_dict: TMP is a directory, not a file' },
  { 'recipes/llama2_7b.lua --num_layer=3', 'unknown option --num_layer (did you mean --num_layers?)' },
  -- more: types, ranges, enums, relations, paths
  { 'recipes/llama2_7b.lua --batch_size=2.5', '--batch_size must be an integer, got 2.5' },
  { 'recipes/llama2_7b.lua --batch_size=four', '--batch_size expects a number, got "four"' },
  { 'recipes/llama2_7b.lua --batch_size', '--batch_size expects a value' },
  { 'recipes/llama2_7b.lua --lr=0', '--lr must be > 0, got 0' },
  { 'recipes/llama2_7b.lua --lr=nan', '--lr must be a finite number, got nan' },
  { 'recipes/llama2_7b.lua --min_lr=0.01', '--min_lr (0.01) must be at most --lr (0.0003)' },
  { 'recipes/llama2_7b.lua --beta2=1', '--beta2 must be < 1, got 1' },
  { 'recipes/llama2_7b.lua --seq_len=0', '--seq_len must be >= 1, got 0' },
  { 'recipes/llama2_7b.lua --log_every=-1', '--log_every must be >= 0, got -1' },
  { 'recipes/llama2_7b.lua --profile_steps=3', '--profile_steps must be A:B with 1 <= A <= B (steps), got 3' },
  { 'recipes/llama2_7b.lua --max_steps=5 --profile_steps=6:7',
    '--profile_steps (6:7) starts after the last step (--max_steps=5): nothing would be traced' },
  { 'recipes/llama2_7b.lua --plot', '--plot needs --metrics_file' },
  { 'recipes/llama2_7b.lua --data_noise=2', '--data_noise must be <= 1, got 2' },
  { 'recipes/llama2_7b.lua --dry_run=maybe', '--dry_run expects true or false, got "maybe"' },
  { 'recipes/llama2_7b.lua --model=Llama-2-7', "got 'Llama-2-7' (did you mean Llama-2-7b?)" },
  { 'recipes/llama2_7b.lua --hidden_width=64 --num_heads=5', '--hidden_width (64) must be a multiple of --num_heads (5)' },
  { 'recipes/llama2_7b.lua --num_heads=4 --num_kv_heads=3', '--num_heads (4) must be a multiple of --num_kv_heads (3)' },
  { 'recipes/llama2_7b.lua --hidden_width=100',
    'llama config: dim 100 is not a multiple of n_heads 32 (from --hidden_width, --num_heads)' },
  { 'recipes/llama2_7b.lua --hidden_width=48 --num_heads=16',
    'llama config: head_dim 3 must be even for rotary embeddings (from --hidden_width)' },
  { 'recipes/llama2_7b.lua --checkpoint_freq=10', '--checkpoint_freq needs --checkpoint_dir' },
  { 'recipes/llama2_7b.lua --resume_from_checkpoint', '--resume_from_checkpoint needs --checkpoint_dir' },
  { 'recipes/llama2_7b.lua --keep_checkpoints=-1', '--keep_checkpoints must be >= 0, got -1' },
  { 'recipes/llama2_7b.lua --wrap=sized', "--wrap must be one of transformer, size, none; got 'sized' (did you mean size?)" },
  { 'recipes/llama2_7b.lua --backward_prefetch=forward', "--backward_prefetch must be one of pre, post, none; got 'forward'" },
  { 'recipes/llama2_7b.lua --mixed_precision=fp16', "got 'fp16' (did you mean f16?)" },
  { 'recipes/llama2_7b.lua --plan_device=h100', "got 'h100' (did you mean h100-80g?)" },
  { 'recipes/llama2_7b.lua --wrap_min_params=0', '--wrap_min_params must be >= 1, got 0' },
  { 'recipes/llama2_7b.lua --data=/nonexistent/corpus', '--data: /nonexistent/corpus does not exist' },
  { 'recipes/llama2_7b.lua --data=TMP', '--data: fsdp.data.tokens: TMP holds no train-NNNNN.safetensors shards' },
  { 'recipes/llama2_7b.lua --val_data=/nonexistent/val', '--val_data: /nonexistent/val does not exist' },
  { 'recipes/llama2_7b.lua --data=/nonexistent/c4-*.json.gz', '--data: /nonexistent/c4-*.json.gz: no file matches the pattern' },
  { 'recipes/llama2_7b.lua --metrics_file=/proc/metrics.jsonl', '--metrics_file: cannot write in /proc' },
  -- the seed's options (aliases): checked under the name the user wrote
  { 'recipes/llama2_7b.lua --max_context_width=0', '--max_context_width must be >= 1, got 0' },
  { 'recipes/llama2_7b.lua --num_heads=4 --num_key_value_heads=3',
    '--num_heads (4) must be a multiple of --num_key_value_heads (3)' },
  { 'recipes/llama2_7b.lua --hidden_width=64 --intermediate_size=-1', '--intermediate_size must be >= 0, got -1' },
  { 'recipes/llama2_7b.lua --train_batch_size=0', '--train_batch_size must be >= 1, got 0' },
  { 'recipes/llama2_7b.lua --seq_len=8 --max_context_width=16',
    '--seq_len and --max_context_width are the same option (seq_len): give it once' },
  { 'recipes/llama2_7b.lua --model_type=gpt_neox', "--model_type must be one of llama_v2; got 'gpt_neox'" },
  { 'recipes/llama2_7b.lua --sharding_strategy=hybird', "got 'hybird' (did you mean hybrid?)" },
  { 'recipes/llama2_7b.lua --bf16=maybe', "--bf16 must be one of 0, 1, false, true; got 'maybe'" },
  { 'recipes/llama2_7b.lua --max_contxt_width=3', 'unknown option --max_contxt_width (did you mean --max_context_width?)' },
  { 'recipes/llama2_7b.lua --checkpoint_dir=TMP/a --resume_from_checkpoint=TMP/b',
    '--resume_from_checkpoint=TMP/b and --checkpoint_dir=TMP/a disagree' },
  { 'recipes/llama2_7b.lua --dataset=wikitext',
    '--dataset wikitext: no such file or directory, nor a Hugging Face dataset this build knows (allenai/c4, c4)' },
  { 'recipes/llama2_7b.lua --dataset=TMP', '--dataset: fsdp.data.tokens: TMP holds no train-NNNNN.safetensors shards' },
  { 'recipes/llama2_7b.lua --dataset_config_name=en',
    '--dataset_config_name (en) names a config of a Hugging Face dataset given as --dataset (allenai/c4, c4)' },
  { 'recipes/llama2_7b.lua --tokenizer=hf-internal-testing/llama-tokenizer', '--tokenizer needs --data' },
  { 'recipes/llama2_7b.lua --grad_accum_steps=0', '--grad_accum_steps must be >= 1, got 0' },
  { 'recipes/llama2_7b.lua --plan --plan_world=6 --plan_nodes=4', '--plan_nodes (4) must divide the world planned for (6 ranks)' },
  { 'recipes/t5_3b.lua --task=sort', "--task must be one of reverse, copy; got 'sort'" },
  { 'recipes/t5_3b.lua --optimizer=adam', "got 'adam' (did you mean adamw?)" },
  { 'recipes/t5_11b.lua --min_len=9', '--min_len (9) must be at most --max_len (8)' },
  { 'recipes/t5_3b.lua --vocab_size=2', '--vocab_size must be 0 (keep) or >= 3' },
  { 'recipes/t5_3b.lua --d_model=-1', '--d_model must be >= 0, got -1' },
  { 'recipes/t5_3b.lua --dropout=1', '--dropout must be < 1, got 1' },
  { 'recipes/t5_3b.lua --model=t5-3', "got 't5-3' (did you mean t5-3b?)" },
  { 'recipes/t5_3b.lua --max_steps=10', '--warmup_steps (20) must be less than --max_steps (10)' },
  { 'recipes/deepvit_8b.lua --depth=-1', '--depth must be >= 0, got -1' },
  { 'recipes/deepvit_8b.lua --dropout=2', '--dropout must be -1 (keep) or in [0, 1), got 2' },
  { 'recipes/deepvit_8b.lua --image_size=100 --patch_size=32', '--image_size (100) must be a multiple of --patch_size (32)' },
  { 'recipes/deepvit_8b.lua --image_size=100',
    'deepvit config: image_size 100 is not a multiple of patch_size 32 (from --image_size, --patch_size)' },
  { 'recipes/deepvit_8b.lua --model=8b', "--model must be one of 1B, 3B, 60M, 8B, tiny; got '8b' (did you mean 8B?)" },
  { 'recipes/deepvit_8b.lua --data=/nonexistent/images', '--data: /nonexistent/images does not exist' },
  { 'recipes/mnist.lua --batch_size=0', '--batch_size must be >= 1, got 0' },
  { 'recipes/mnist.lua --epochs=0', '--epochs must be >= 1, got 0' },
  { 'recipes/mnist.lua --lr=-1', '--lr must be > 0, got -1' },
  { 'recipes/mnist.lua --data=/etc/passwd', '--data: /etc/passwd is not a directory' },
  { 'recipes/quickstart.lua --ranks=0', '--ranks must be >= 1, got 0' },
  { 'recipes/quickstart.lua --dim=1000 --ranks=3', '--dim (1000) must be a multiple of --ranks (3)' },
  { 'recipes/quickstart.lua --rank=2', 'unknown option --rank (did you mean --ranks?)' },
  { 'recipes/sweep.lua --steps=0', '--steps must be >= 1, got 0' },
  { 'recipes/sweep.lua --grid=dtype', '--grid is not a grid: bad grid axis "dtype"' },
  { 'recipes/sweep.lua --find_batch', '--find_batch needs --memory_limit_mb' },
  { 'recipes/sweep.lua --grid=batch_size=0,2 --args=' .. T.quote(SMALL),
    'grid point 1 of 2 (batch_size=0): --batch_size must be >= 1, got 0' },
  { 'recipes/sweep.lua --grid=bogus=1,2 --args=' .. T.quote(SMALL),
    'unknown option --bogus (valid: activation_checkpointing' },
  -- issue 41: words that are not options ran the default 7B ([Note: command-line words] in fsdp.options)
  { 'recipes/llama2_7b.lua model=tiny', 'fsdp-lua: model=tiny is not an option (did you mean --model=tiny?)\n' },
  { 'recipes/llama2_7b.lua -model=tiny', 'fsdp-lua: -model=tiny is not an option (did you mean --model=tiny?)\n' },
  { 'recipes/llama2_7b.lua --model=tiny --dry_run false', "fsdp-lua: unexpected argument 'false' after --dry_run, "
    .. 'which takes no value (did you mean --dry_run=false?)\n' },
  { 'recipes/llama2_7b.lua tiny', "fsdp-lua: unexpected argument 'tiny': recipes/llama2_7b.lua takes options only "
    .. '(--key=value or --key value; --help lists them)\n' },
  { 'recipes/t5_3b.lua -dry-run', 'fsdp-lua: -dry-run is not an option (did you mean --dry-run?)\n' },
  { 'recipes/llama2_7b.lua --model', 'fsdp-lua: --model expects a value (--model=VALUE or --model VALUE)\n' },
  { 'recipes/llama2_7b.lua --config=TMP/files/bad.yaml',
    'fsdp-lua: --config TMP/files/bad.yaml: unknown option training.lrr (did you mean lr?)\n' },
  { 'recipes/llama2_7b.lua --model=tiny --metrics_file=TMP/files/old.jsonl',
    'fsdp-lua: --metrics_file (TMP/files/old.jsonl) holds the records of an earlier run: give '
    .. '--metrics_file_mode=append or --metrics_file_mode=overwrite, --resume_from_checkpoint to continue that run, '
    .. 'or another file\n' },
  { 'recipes/llama2_7b.lua --metrics_file_mode=apend', "--metrics_file_mode must be one of new, append, overwrite; "
    .. "got 'apend' (did you mean append?)" },
}

describe('recipes refuse bad options before building anything', function()
  local slowest = 0
  setup(function()
    -- (in a directory of their own: TMP itself is an empty --data)
    os.execute('mkdir -p ' .. T.quote(tmp .. '/files'))
    local texts = { ['bad.yaml'] = 'model: tiny\ntraining:\n  lrr: 1e-4\n', ['old.jsonl'] = '{"step": 1}\n' }
    for name, text in pairs(texts) do
      local f = assert(io.open(tmp .. '/files/' .. name, 'w'))
      f:write(text)
      f:close()
    end
  end)
  for _, case in ipairs(CASES) do
    it(case[1], function()
      local args, want = case[1]:gsub('TMP', tmp), case[2]:gsub('TMP', tmp)
      local rc, stdout, stderr, dt = run(args)
      slowest = math.max(slowest, dt)
      assert.are.equal(2, rc, stdout .. stderr)
      -- one line, the option named in it
      assert.matches('^fsdp%-lua: [^\n]+\n$', stderr)
      assert.matches(want, stderr, 1, true)
      assert.is_nil(stderr:find('traceback', 1, true))
      -- nothing built: the recipes print their config only after the checks
      assert.are.equal('', stdout)
      -- a process start and the checks; building the 7B on meta alone takes longer
      assert.is_true(dt < 10, ('%.2f s'):format(dt))
    end)
  end
  teardown(function() print(('# slowest of %d refusals: %.2f s'):format(#CASES, slowest)) end)
end)

describe('the fit check', function()
  it('refuses the default 7B recipe with the planner\'s numbers before allocating', function()
    -- A budget that holds the weights (25.1 GiB), not the step (the cheap
    -- bound below refuses less).
    local rc, stdout, stderr, dt = run('recipes/llama2_7b.lua --memory_limit_mb=40960')
    assert.are.equal(2, rc, stdout .. stderr)
    assert.matches('^fsdp%-lua: recipes/llama2_7b.lua: does not fit: planned peak 105.8 GiB per rank %(parameters '
      .. '25.1 GiB, gradients 25.1 GiB, optimizer 50.2 GiB, activations [%d.]+ GiB%) > 40.0 GiB available %(', stderr)
    assert.matches('try %-%-dtype=bf16 .* fewer layers %(%-%-num_layers%); or %-%-skip_fit_check; to try the recipe '
      .. 'here: %-%-model=tiny .*, %-%-dry%-run .* or %-%-plan .*\n$', stderr)
    assert.is_nil(stdout:find('sharding:', 1, true), stdout)
    print(('# 7B refused by the fit check in %.2f s'):format(dt))
  end)

  -- issue 38: [Note: sizes are bounded before building] in fsdp.sharding.fit
  it('refuses weights past the budget from the config alone, before printing or building anything', function()
    local rc, stdout, stderr, dt = run('recipes/llama2_7b.lua --memory_limit_mb=16384')
    assert.are.equal(2, rc, stdout .. stderr)
    assert.are.equal('fsdp-lua: --model Llama-2-7b: num_layers 32, hidden_width 4096, num_heads 32, ffn_dim 11008, '
      .. 'vocab_size 32000: 6.74e+09 parameters, 25.1 GiB of f32 weights: more than the 16.0 GiB available '
      .. '(--memory_limit_mb=16384); try --dtype=bf16 (half the bytes), fewer layers (--num_layers) or more ranks; '
      .. 'to try the recipe here: --model=tiny (a small Llama that trains in seconds), --dry-run (the full size on '
      .. 'meta, nothing allocated) or --plan (what each rank would hold, send and compute)\n',
      stderr)
    assert.are.equal('', stdout)
    assert.is_true(dt < 10, ('%.2f s'):format(dt))
    -- --skip_fit_check goes past the weights too (the planner's check is skipped as well)
    rc, stdout, stderr = run('recipes/llama2_7b.lua --memory_limit_mb=16384 --skip_fit_check --validate_options')
    assert.are.equal(0, rc, stderr)
  end)

  it('suggests a smaller batch and checkpointing when activations are the peak; --skip_fit_check goes on', function()
    local args = 'recipes/llama2_7b.lua --num_layers=2 --hidden_width=32 --num_heads=2 --vocab_size=64 --batch_size=64 '
      .. '--seq_len=256 --max_steps=1 --warmup_steps=0 --memory_limit_mb=8'
    local rc, stdout, stderr = run(args)
    assert.are.equal(2, rc, stdout .. stderr)
    assert.matches('> 8%.0 MiB available %(%-%-memory_limit_mb=8%); try a smaller %-%-batch_size %(now 64; %d+ fits%), '
      .. '%-%-activation_checkpointing', stderr)
    -- The batch it names fits the plan: the same run with it passes the check.
    local fits = stderr:match('(%d+) fits')
    rc, stdout, stderr = run(args:gsub('%-%-batch_size=64', '--batch_size=' .. fits) .. ' --validate_options')
    assert.are.equal(0, rc, stderr)
    -- Skipped, the same run meets the limit for real.
    rc, stdout, stderr = run(args .. ' --skip_fit_check')
    assert.are.equal(1, rc, stdout .. stderr)
    assert.matches('out of memory', stderr, 1, true)
    assert.matches('sharding:', stdout, 1, true)
  end)
end)

-- issue 38 ("Trust, round two"): sizes that are integers but absurd,
-- values that are not finite, and config.json mistakes found late. Each
-- is one line naming the HF key and the file (or the option), a non-zero
-- exit, and quick: a regression that builds instead meets a short timeout.
describe('absurd sizes, non-finite values and config.json mistakes', function()
  local GOLDEN = 'tests/golden/hf/'
  local dirs = {}
  -- A copy of a golden directory whose config.json has `from` replaced by `to`.
  local function hf_dir(name, golden, from, to, from2, to2)
    local d = tmp .. '/' .. name
    files.mkdir_p(d)
    local text = files.read(GOLDEN .. golden .. '/config.json')
    for _, r in ipairs({ { from, to }, { from2, to2 } }) do
      if r[1] then
        local n
        text, n = text:gsub(r[1]:gsub('%p', '%%%0'), (r[2]:gsub('%%', '%%%%')))
        assert(n == 1, ('%s: %s not in %s'):format(name, r[1], golden))
      end
    end
    files.write_atomic(d .. '/config.json', text)
    assert(os.execute(('cp %s %s/'):format(T.quote(GOLDEN .. golden .. '/model.safetensors'), T.quote(d))) == 0)
    dirs[name] = d
    return d
  end
  setup(function()
    hf_dir('layers', 'llama2_tiny', '"num_hidden_layers": 2', '"num_hidden_layers": 1e12')
    hf_dir('infinity', 'llama2_tiny', '"num_hidden_layers": 2', '"num_hidden_layers": Infinity')
    hf_dir('huge', 'llama2_tiny', '"num_hidden_layers": 2', '"num_hidden_layers": 2e308')
    hf_dir('nan_eps', 'llama2_tiny', '"rms_norm_eps": 1e-05', '"rms_norm_eps": NaN')
    hf_dir('odd', 'llama2_tiny', '"head_dim": 8,', '', '"hidden_size": 32', '"hidden_size": 30')
    hf_dir('missing', 'llama2_tiny', '"num_hidden_layers": 2,', '')
    hf_dir('nested', 'llama2_tiny', '"rope_scaling": null', '"rope_scaling": {"rope_type": "llama3", "factor": '
      .. '{"a": 1}, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 16}')
    hf_dir('ffn', 'llama2_tiny', '"intermediate_size": 48', '"intermediate_size": 40')
    hf_dir('t5_layers', 't5_v1_0_tiny', '"num_layers": 2', '"num_layers": 1e12')
    hf_dir('gpt2_layers', 'gpt2_tiny', '"n_layer": 2', '"n_layer": 1e12')
    -- a NaN in one weight of an otherwise good directory
    local d = hf_dir('nan_weight', 'llama2_tiny', '"use_cache": true', '"use_cache": true')
    local fsdp = require 'fsdp'
    local sd = {}
    -- (cloned: the loaded tensors map the file read-only)
    for name, t in pairs(fsdp.load_safetensors(GOLDEN .. 'llama2_tiny/model.safetensors')) do sd[name] = t:clone() end
    sd['model.layers.1.mlp.up_proj.weight']:view(-1):narrow(0, 5, 1):fill_(0 / 0)
    fsdp.save_safetensors(d .. '/model.safetensors', sd)
  end)

  local LLAMA = GOLDEN .. 'llama2_tiny'
  -- {arguments (DIR:name is that directory), the one line, exit status (2)}
  local CASES38 = {
    -- (A) sizes bounded before building, for every family and path
    { 'recipes/llama2_7b.lua --init_from=DIR:layers', '--init_from DIR:layers/config.json: num_hidden_layers 1e+12, '
      .. 'hidden_size 32, num_attention_heads 4, intermediate_size 48, vocab_size 64: 1e+12 blocks to build, 14.6 PiB '
      .. 'of CPU memory at 16 KiB each on meta, more than the ' },
    { 'recipes/generate.lua --init_from=DIR:layers --prompt_ids=1', '--init_from DIR:layers/config.json: '
      .. 'num_hidden_layers 1e+12, ' },
    { 'recipes/llama2_7b.lua --init_from=DIR:infinity',
      '--init_from DIR:infinity/config.json: num_hidden_layers must be a finite number, got inf' },
    { 'recipes/generate.lua --init_from=DIR:huge --prompt_ids=1',
      '--init_from DIR:huge/config.json: num_hidden_layers must be a finite number, got inf' },
    { 'recipes/t5_3b.lua --init_from=DIR:t5_layers', '--init_from DIR:t5_layers/config.json: num_layers 1e+12, '
      .. 'num_decoder_layers 2, d_model 16, ' },
    { 'recipes/generate.lua --init_from=DIR:gpt2_layers --prompt_ids=1',
      '--init_from DIR:gpt2_layers/config.json: n_layer 1e+12, n_embd ' },
    { 'recipes/llama2_7b.lua --model=tiny --num_layers=1e12 --dry_run',
      '--model tiny: --num_layers 1e+12, hidden_width 64, num_heads 4, ffn_dim 176, vocab_size 256: 1e+12 blocks to build' },
    { 'recipes/t5_3b.lua --model=tiny --num_layers=1e12', '--model tiny: --num_layers 1e+12, d_model ' },
    { 'recipes/llama2_7b.lua --model=tiny --batch_size=1e12', '--batch_size 1000000000000 x --seq_len 128: 1.28e+14 '
      .. 'tokens per micro-batch, past the 2^31 rows a matrix product takes' },
    { 'recipes/deepvit_8b.lua --model=tiny --depth=1e12', '--model tiny: --depth 1e+12, dim 64, ' },
    { 'recipes/generate.lua --model=tiny --prompt_ids=1,2 --max_new_tokens=1e9 --allow_past_max_positions',
      '--model tiny: n_layers 2, dim 64, num_heads 4, ffn_dim 176, vocab_size 256: 125248 parameters, 0.5 MiB of f32 '
      .. 'weights + 476.8 GiB of KV cache (1 prompt x 1000000002 positions): more than the ' },
    -- (a sliding layer's cache is a ring of its window: Gemma 2's one global layer of two is the cache)
    { 'recipes/generate.lua --model=gemma2-tiny --prompt_ids=1,2 --max_new_tokens=1e9 --allow_past_max_positions',
      'f32 weights + 238.4 GiB of KV cache (1 prompt x 1000000002 positions, 1 sliding layer bounded by the window): '
      .. 'more than the ' },
    { 'recipes/quickstart.lua --dim=1000000 --ranks=1', '--dim 1000000: the 1000000 x 1000000 f32 weight and a shard '
      .. 'take 14.6 TiB, more than the ' },
    -- positions past the model's limit, for every family that has one
    { 'recipes/generate.lua --init_from=' .. LLAMA .. ' --prompt_ids=1,2,3 --max_new_tokens=62',
      "the longest prompt (3 tokens, --prompt_ids) plus --max_new_tokens (62) is longer than the model's 64 positions "
      .. '(max_position_embeddings of ' .. LLAMA .. '/config.json); give --allow_past_max_positions to run past them' },
    { 'recipes/generate.lua --model=tiny --prompt_ids=1 --max_new_tokens=600',
      "is longer than the model's 512 positions (max_position_embeddings of --model tiny)" },
    { 'recipes/generate.lua --init_from=' .. GOLDEN .. 'gpt2_tiny --prompt_ids=1,2 --max_new_tokens=15 '
      .. '--allow_past_max_positions', "plus --max_new_tokens (15) is longer than the model's 16 positions "
      .. '(n_positions of ' .. GOLDEN .. 'gpt2_tiny/config.json)' },
    { 'recipes/llama2_7b.lua --init_from=' .. LLAMA, "--seq_len (128) is longer than the model's 64 positions "
      .. '(max_position_embeddings of ' .. LLAMA .. '/config.json); give --allow_past_max_positions' },
    { 'recipes/llama2_7b.lua --model=tiny --seq_len=1024', "--seq_len (1024) is longer than the model's 512 positions" },
    -- (B) finite means finite
    { 'recipes/generate.lua --init_from=DIR:nan_eps --prompt_ids=1',
      '--init_from DIR:nan_eps/config.json: rms_norm_eps must be a finite number, got nan' },
    { 'recipes/generate.lua --init_from=DIR:nan_weight --prompt_ids=1 --max_new_tokens=2', '--init_from DIR:nan_weight: '
      .. 'model.layers.1.mlp.up_proj.weight holds NaN or infinite values (DIR:nan_weight/model.safetensors)', 1 },
    { 'recipes/generate.lua --model=tiny --prompt_ids=1 --temperature=nan', '--temperature must be a finite number, got nan' },
    { 'recipes/generate.lua --model=tiny --prompt_ids=1,1e999', '--prompt_ids: "1e999" is not a token id' },
    -- (C) the user's key and file, before anything is built
    { 'recipes/llama2_7b.lua --init_from=DIR:odd',
      '--init_from DIR:odd/config.json: hidden_size 30 is not a multiple of num_attention_heads 4' },
    { 'recipes/llama2_7b.lua --init_from=DIR:missing', '--init_from DIR:missing/config.json: num_hidden_layers is missing' },
    { 'recipes/llama2_7b.lua --init_from=DIR:ffn --seq_len=16', '--init_from DIR:ffn/config.json: size mismatch for '
      .. 'model.layers.0.mlp.down_proj.weight: DIR:ffn/model.safetensors has [32, 48], the model this config.json '
      .. 'describes [32, 40]' },
    { 'recipes/llama2_7b.lua --init_from=DIR:nested',
      '--init_from DIR:nested/config.json: rope_scaling.factor must be a number, got {"a": 1}' },
  }
  for _, case in ipairs(CASES38) do
    it(case[1], function()
      local function sub(text) return (text:gsub('DIR:([%w_]+)', function(n) return dirs[n] end)) end
      local rc, stdout, stderr, dt = run(sub(case[1]), nil, 30)
      assert.are.equal(case[3] or 2, rc, stdout .. stderr)
      assert.matches('^fsdp%-lua: [^\n]+\n$', stderr)
      assert.matches(sub(case[2]), stderr, 1, true)
      assert.is_nil(stderr:find('table: 0x', 1, true))
      assert.is_nil(stderr:find('%.lua:%d+:'), stderr)
      assert.are.equal('', stdout)
      assert.is_true(dt < 10, ('%.2f s'):format(dt))
    end)
  end

  it('--allow_past_max_positions lets a Llama run past its positions (GPT-2 never: its table ends)', function()
    local rc, stdout, stderr = run('recipes/generate.lua --init_from=' .. LLAMA .. ' --prompt_ids=1,2,3 '
      .. '--max_new_tokens=62 --allow_past_max_positions --stop_ids=none', nil, 60)
    assert.are.equal(0, rc, stderr)
    assert.matches('generated 62 tokens for 1 prompt', stdout, 1, true)
  end)
end)

describe('output paths', function()
  it('are created and probed at start', function()
    local ckpt, full, metrics = tmp .. '/a/ckpt', tmp .. '/b/c/model.safetensors', tmp .. '/d/m.jsonl'
    -- (a tiny model: --validate_options holds the sizes to this machine too)
    local rc, stdout, stderr = run(('recipes/llama2_7b.lua --model=tiny --checkpoint_dir=%s --save_full_state_dict=%s '
      .. '--metrics_file=%s --validate_options'):format(ckpt, full, metrics))
    assert.are.equal(0, rc, stdout .. stderr)
    assert.are.equal('options: ok\n', stdout)
    assert.are.equal('directory', files.mode(ckpt))
    assert.are.equal('directory', files.mode(tmp .. '/b/c'))
    assert.are.equal('directory', files.mode(tmp .. '/d'))
    -- only the directories: no file is left behind
    assert.is_nil(files.mode(full))
    assert.is_nil(files.mode(metrics))
    assert.are.same({}, files.list(ckpt))
  end)
end)

describe('--nproc', function()
  it('is bounded before mpirun starts', function()
    -- A launcher that would leave a mark if it ran.
    local mark, fake = tmp .. '/mpirun-ran', tmp .. '/mpirun'
    local f = assert(io.open(fake, 'w'))
    f:write('#!/bin/sh\ntouch ' .. T.quote(mark) .. '\n')
    f:close()
    os.execute('chmod +x ' .. T.quote(fake))
    local env = 'FSDP_MPIRUN=' .. T.quote(fake)
    local rc, _, stderr, dt = run('--nproc 100000 recipes/mnist.lua', env)
    assert.are.equal(2, rc)
    assert.matches("^fsdp%-lua: %-%-nproc 100000 is more than this machine's maximum of %d+ ranks", stderr)
    assert.is_nil(files.mode(mark))
    assert.is_true(dt < 10)
    rc, _, stderr = run('--nproc=3 recipes/mnist.lua', 'FSDP_MAX_NPROC=2 ' .. env)
    assert.are.equal(2, rc)
    assert.matches('--nproc 3 is more than FSDP_MAX_NPROC=2 ranks', stderr, 1, true)
    assert.is_nil(files.mode(mark))
    -- Within the maximum the launcher runs.
    rc = run('--nproc 2 recipes/mnist.lua', env)
    assert.are.equal(0, rc)
    assert.are.equal('file', files.mode(mark))
  end)
end)

-- issue 41: the first contact
describe('a first run', function()
  it('of the default 7B that does not fit names --model=tiny, --dry-run and --plan in its first lines', function()
    local rc, stdout, stderr = run('recipes/llama2_7b.lua --memory_limit_mb=40960')
    assert.are.equal(2, rc)
    -- the config dump is what differs from the defaults
    assert.matches('^config:\n  memory_limit_mb = 40960\n  %(%d+ other options at their defaults: %-%-print_config '
      .. 'lists them all%)\n$', stdout)
    assert.matches('; to try the recipe here: --model=tiny (a small Llama that trains in seconds), --dry-run (the full '
      .. 'size on meta, nothing allocated) or --plan (what each rank would hold, send and compute)\n', stderr, 1, true)
  end)

  it('takes --key value and --no-flag, and names the recipes with --list', function()
    local rc, stdout, stderr = run('recipes/llama2_7b.lua --model tiny --max_steps 50 --no-activation_checkpointing '
      .. '--no-reshard_after_forward --validate_options')
    assert.are.equal(0, rc, stderr)
    assert.are.equal('options: ok\n', stdout)
    for _, args in ipairs({ '--list', 'recipes' }) do
      rc, stdout, stderr = run(args)
      assert.are.equal(0, rc, stderr)
      assert.matches('^%d+ recipes %(fsdp%-lua recipes/NAME.lua %-%-help lists one\'s options%):\n', stdout)
      assert.matches('\n  recipes/llama2_7b.lua  train Llama 2 7B, the seed recipe\n', stdout, 1, true)
      assert.is_nil(stdout:find('t5_training', 1, true)) -- helper modules live in models/
    end
    local _, help = run('--help')
    assert.matches('--list', help, 1, true)
  end)

  it('keeps another run\'s --metrics_file only when told (append, overwrite) or resuming', function()
    local m = tmp .. '/files/mode.jsonl'
    local f = assert(io.open(m, 'w'))
    f:write('{"old": true}\n')
    f:close()
    local base = 'recipes/llama2_7b.lua ' .. SMALL .. ' --max_steps=1 --warmup_steps=0 --validation_freq=0 '
      .. '--metrics_file=' .. m
    local rc, _, stderr = run(base)
    assert.are.equal(2, rc)
    assert.matches('holds the records of an earlier run', stderr, 1, true)
    rc, _, stderr = run(base .. ' --metrics_file_mode=append')
    assert.are.equal(0, rc, stderr)
    local text = files.read(m)
    assert.matches('^{"old": true}\n{', text)
    rc, _, stderr = run(base .. ' --metrics_file_mode overwrite')
    assert.are.equal(0, rc, stderr)
    text = files.read(m)
    assert.is_nil(text:find('old', 1, true))
    assert.matches('"step":1', text, 1, true)
  end)

  it('saves its options beside the checkpoints, and --config repeats the run from them', function()
    local ck = tmp .. '/files/first-ck'
    local args = 'recipes/llama2_7b.lua ' .. SMALL .. ' --max_steps=2 --warmup_steps=1 --validation_freq=0 --eps 1e-6 '
      .. '--checkpoint_freq=2 --checkpoint_dir=' .. ck
    local rc, stdout, stderr = run(args)
    assert.are.equal(0, rc, stderr)
    assert.matches(('config: saved %s/config.yaml (fsdp-lua recipes/llama2_7b.lua --config %s/config.yaml repeats '
      .. 'this run)'):format(ck, ck), stdout, 1, true)
    local loss = stdout:match('Batch 2 Loss: ([%d.]+)')
    local saved = files.read(ck .. '/config.yaml')
    assert.matches('\neps: 1e-06\n', saved, 1, true)
    rc, stdout, stderr = run(('recipes/llama2_7b.lua --config %s/config.yaml --checkpoint_dir=%s/files/again')
      :format(ck, tmp))
    assert.are.equal(0, rc, stderr)
    assert.are.equal(loss, stdout:match('Batch 2 Loss: ([%d.]+)'))
  end)
end)
