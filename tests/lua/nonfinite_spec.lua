-- nonfinite_spec.lua: the non-finite guard of training (fsdp.nonfinite) in
-- one process: a finite step is applied (clipped only with grad_clip > 0),
-- a NaN/inf loss or gradient stops naming the step and the first parameter
-- or is skipped leaving parameters and optimizer state exactly as they
-- were, the skip bound; and the recipes end to end: --lr=1e6 exits 3 at
-- the first non-finite step, nothing non-finite on disk (also when the
-- update itself overflows), the last finite checkpoints kept, the skip
-- count carried across a resume. The same on 2
-- and 4 ranks: tests/mpi/nonfinite.sh.
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local nonfinite = require 'fsdp.nonfinite'
local files = require 'fsdp.io.files'
local T = require 'fsdp.testing'
local F = fsdp.F

local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 4, ffn_dim = 64, vocab_size = 64, max_seq_len = 16 }
local ids = fsdp.randint(0, 64, { 2, 16 }, { seed = 1 })
local tg = fsdp.randint(0, 64, { 2, 16 }, { seed = 2 })

local function sharded()
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  return fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 3 })
end

-- model, optimizer, scheduler and a guard over them.
local function setup(opts)
  local m = opts.model or sharded()
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-2 })
  local sched = optim.lr_scheduler.WarmupCosine(opt, { warmup_steps = 2, total_steps = 20 })
  local lines = {}
  local g = nonfinite.Guard({ model = m, optimizer = opt, scheduler = sched, policy = opts.policy,
    max_skips = opts.max_skips, grad_clip = opts.grad_clip, say = function(l) lines[#lines + 1] = l end })
  return m, opt, sched, g, lines
end

local function backward(m) local loss = m:loss(ids, tg); loss:backward(); return loss end

local function poison(m, names)
  for _, np in ipairs(m:named_parameters()) do
    if names[np[1]] then np[2].grad:fill_(0 / 0) end
  end
end

-- Every parameter and optimizer state tensor, cloned.
local function snapshot(m, opt)
  local s = {}
  for _, np in ipairs(m:named_parameters()) do
    s[np[1]] = np[2]:detach():clone()
    for k, v in pairs(opt.state[np[1]] or {}) do
      s[np[1] .. '#' .. k] = fsdp.is_tensor(v) and v:clone() or v
    end
  end
  return s
end

local function same(a, b)
  for k, v in pairs(a) do
    local w = b[k]
    if fsdp.is_tensor(v) then
      if F.ne(v:view(-1), w:view(-1)):to('i64'):sum():item() ~= 0 then return false, k end
    elseif v ~= w then return false, k end
  end
  for k in pairs(b) do if a[k] == nil then return false, k end end
  return true
end

describe('fsdp.nonfinite guard', function()
  it('applies a finite step: the global norm before clipping, clipping only with grad_clip > 0', function()
    for _, clip in ipairs({ 0, 0.01 }) do
      local m, opt, sched, g = setup({ grad_clip = clip })
      backward(m)
      local want = fsdp.grad_norm(m)
      local before = snapshot(m, opt)
      local r = g:step(1, 3.5)
      assert.equals(want, r.grad_norm)
      assert.equals(3.5, r.loss)
      assert.is_nil(r.skipped)
      assert.equals(1, sched.last_step)
      assert.is_false(same(before, snapshot(m, opt)))
      for _, p in ipairs(m:parameters()) do assert.is_nil(p.grad) end
    end
    -- clipping: the guard's update equals clip_grad_norm's then step
    local m1, opt1, _, g1 = setup({ grad_clip = 0.01 })
    local m2, opt2 = setup({})
    backward(m1)
    backward(m2)
    g1:step(1, 1)
    fsdp.clip_grad_norm(m2, 0.01)
    opt2:step()
    assert.is_true(same(snapshot(m1, opt1), snapshot(m2, opt2)))
  end)

  it('stops at a NaN gradient naming the step and the first parameter (model order), applying nothing', function()
    local m, opt, sched, g = setup({})
    backward(m)
    g:step(1, 1)
    backward(m)
    poison(m, { ['lm_head.weight'] = true, ['model.layers.1.mlp.up_proj.weight'] = true })
    local before = snapshot(m, opt)
    local ok, err = pcall(g.step, g, 2, 4.25)
    assert.is_false(ok)
    assert.matches('step 2: non%-finite loss or gradient norm %(loss 4%.25, gradient norm nan%); first parameter '
      .. 'with a non%-finite gradient: model%.layers%.1%.mlp%.up_proj%.weight %(unit model%.layers%.1%); stopped '
      .. 'before applying it %(%-%-on_nonfinite=stop%)', err)
    assert.is_true(same(before, snapshot(m, opt)))
    assert.equals(1, sched.last_step)
  end)

  it('stops at a non-finite loss whose gradients are finite, and on a plain (unsharded) model', function()
    local m, _, _, g = setup({})
    backward(m)
    local ok, err = pcall(g.step, g, 5, 1 / 0)
    assert.is_false(ok)
    assert.matches("step 5: non%-finite loss or gradient norm %(loss inf, gradient norm [%d.]+%); no parameter's "
      .. 'gradient holds a NaN or infinite element', err)
    local plain = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
    plain:init_weights({ seed = 3, device = 'cpu' })
    local _, opt2, _, g2 = setup({ model = plain })
    backward(plain)
    poison(plain, { ['model.norm.weight'] = true })
    local before = snapshot(plain, opt2)
    ok, err = pcall(g2.step, g2, 9, 2)
    assert.is_false(ok)
    assert.matches('step 9: .*first parameter with a non%-finite gradient: model%.norm%.weight;', err)
    assert.is_true(same(before, snapshot(plain, opt2)))
  end)

  it('skip_step drops the step (parameters, optimizer state and schedule as before), up to max_skips', function()
    local m, opt, sched, g, lines = setup({ policy = 'skip_step', max_skips = 2, grad_clip = 1 })
    backward(m)
    g:step(1, 1)
    for step = 2, 3 do
      backward(m)
      poison(m, { ['model.embed_tokens.weight'] = true })
      local before = snapshot(m, opt)
      local r = g:step(step, 1)
      assert.is_true(r.skipped)
      assert.is_true(same(before, snapshot(m, opt)))
      assert.equals(1, sched.last_step)
      for _, p in ipairs(m:parameters()) do assert.is_nil(p.grad) end
      assert.equals(step - 1, g.skips)
      assert.matches(('step %d: .*model%%.embed_tokens%%.weight %%(unit <root>%%); step skipped: no update, '
        .. 'gradients dropped %%(skip %d of at most 2'):format(step, step - 1), lines[#lines])
    end
    -- the dropped gradients do not leak into the next step: it equals a
    -- fresh model's step from the same parameters
    backward(m)
    local r = g:step(4, 1)
    assert.is_nil(r.skipped)
    assert.equals(2, sched.last_step)
    backward(m)
    poison(m, { ['lm_head.weight'] = true })
    local ok, err = pcall(g.step, g, 5, 1)
    assert.is_false(ok)
    assert.matches('step 5: .*lm_head%.weight %(unit <root>%); stopped: 2 steps were skipped already '
      .. '%(%-%-max_nonfinite_skips=2%)', err)
  end)

  it('a skipped step leaves no trace in the next: it equals the run that never had it', function()
    local m1, opt1, _, g1 = setup({ policy = 'skip_step' })
    local m2, opt2, _, g2 = setup({})
    backward(m1); g1:step(1, 1)
    backward(m2); g2:step(1, 1)
    backward(m1); poison(m1, { ['model.norm.weight'] = true }); g1:step(2, 1)
    backward(m1); g1:step(3, 1)
    backward(m2); g2:step(2, 1)
    assert.is_true(same(snapshot(m1, opt1), snapshot(m2, opt2)))
  end)

  it('checks its options', function()
    assert.error_matches(function() setup({ policy = 'ignore' }) end,
      "%-%-on_nonfinite must be stop or skip_step, got 'ignore'")
    assert.error_matches(function() setup({ max_skips = -1 }) end, '%-%-max_nonfinite_skips must be an integer >= 0')
  end)
end)

describe('the recipes under the guard', function()
  local LLAMA = '--num_layers=2 --hidden_width=32 --num_heads=4 --vocab_size=64 --batch_size=2 --seq_len=16 '
    .. '--warmup_steps=2 --validation_freq=0 '
  local function llama_run(args, env) return T.sh((env or '') .. ' timeout 120 ' .. T.quote(require('fsdp.host').exe)
      .. ' recipes/llama2_7b.lua ' .. LLAMA .. args) end
  local function steps_on_disk(dir)
    local out = {}
    for _, name in ipairs(files.list(dir)) do
      if name:match('^step%-') then out[#out + 1] = name end -- (not LOCK, the directory's owner)
    end
    table.sort(out)
    return table.concat(out, ' ')
  end
  local function check_finite(step_dir)
    local out, rc = T.run_script('tests/mpi/ckpt_tensors.lua', 'finite ' .. step_dir)
    assert.equals(0, rc, out)
  end

  it('--lr=1e6 exits 3 at the first non-finite step naming it; the finite checkpoint before it is kept', function()
    local dir = T.tmpdir()
    local out, rc = llama_run(('--max_steps=8 --lr=1e6 --checkpoint_dir=%s --checkpoint_freq=1'):format(dir))
    assert.equals(nonfinite.EXIT_STATUS, rc, out)
    local msgs = select(2, out:gsub('fsdp%-lua: recipes/llama2_7b%.lua: step %d+: non%-finite', ''))
    assert.equals(1, msgs, out)
    assert.matches('fsdp%-lua: recipes/llama2_7b%.lua: step 2: non%-finite loss or gradient norm %(loss [%d.e+]+, '
      .. 'gradient norm nan%); first parameter with a non%-finite gradient: model%.embed_tokens%.weight %(unit <root>%); '
      .. 'stopped before applying it %(%-%-on_nonfinite=stop%); the newest checkpoint is ' .. dir:gsub('%p', '%%%0')
      .. '/step%-000001', out)
    assert.equals('step-000001', steps_on_disk(dir))
    check_finite(dir .. '/step-000001')
    files.remove_tree(dir)
  end)

  it('an update that overflows the parameters (finite gradients, --lr=1e39) stops before its checkpoint', function()
    local dir = T.tmpdir()
    local out, rc = llama_run(('--max_steps=4 --lr=1e39 --warmup_steps=0 --checkpoint_dir=%s --checkpoint_freq=1')
      :format(dir))
    assert.equals(nonfinite.EXIT_STATUS, rc, out)
    assert.matches('Batch 1 Loss: [%d.]+', out)
    assert.matches('step 1: the update made parameters non%-finite %(first: model%.embed_tokens%.weight %(unit <root>%)%); '
      .. 'stopped before saving its checkpoint; ' .. dir:gsub('%p', '%%%0') .. ' holds no complete checkpoint', out)
    assert.is_nil(files.mode(dir .. '/step-000001'))
    files.remove_tree(dir)
  end)

  it('a stop saves nothing of its step and prunes nothing: the newest finite checkpoints stay', function()
    local dir = T.tmpdir()
    local out, rc = llama_run(('--max_steps=8 --checkpoint_dir=%s --checkpoint_freq=1 --keep_checkpoints=2 '
      .. '--grad_clip=0'):format(dir), 'FSDP_TEST_NONFINITE_GRAD=5:model.layers.0.self_attn.k_proj.weight')
    assert.equals(nonfinite.EXIT_STATUS, rc, out)
    assert.matches('step 5: .*model%.layers%.0%.self_attn%.k_proj%.weight %(unit model%.layers%.0%)', out)
    assert.equals('step-000003 step-000004', steps_on_disk(dir))
    check_finite(dir .. '/step-000004')
    files.remove_tree(dir)
  end)

  it('skip_step: the run finishes, the skip is logged, its checkpoint equals the one before', function()
    local dir = T.tmpdir()
    local out, rc = llama_run(('--max_steps=4 --checkpoint_dir=%s --checkpoint_freq=1 --keep_checkpoints=0 '
      .. '--on_nonfinite=skip_step --metrics_file=%s/m.jsonl'):format(dir, dir), 'FSDP_TEST_NONFINITE_GRAD=3:lm_head.weight')
    assert.equals(0, rc, out)
    assert.matches('step 3: non%-finite .*lm_head%.weight %(unit <root>%); step skipped: no update, gradients '
      .. 'dropped %(skip 1 of at most 10', out)
    assert.matches('Batch 3 Loss: [%d.]+, .*skipped %(non%-finite: no update%)', out)
    assert.matches('"skipped":true', files.read(dir .. '/m.jsonl'))
    local same_out, same_rc = T.run_script('tests/mpi/ckpt_tensors.lua', ('same %s/step-000002 %s/step-000003'):format(dir, dir))
    assert.equals(0, same_rc, same_out)
    same_out, same_rc = T.run_script('tests/mpi/ckpt_tensors.lua', ('same %s/step-000003 %s/step-000004'):format(dir, dir))
    assert.equals(1, same_rc, same_out) -- step 4 trained again
    files.remove_tree(dir)
  end)

  it('the skip count is checkpointed: a resumed run continues the bound', function()
    local dir = T.tmpdir()
    local args = ('--lr=1e6 --checkpoint_dir=%s --checkpoint_freq=1 --on_nonfinite=skip_step --max_nonfinite_skips=3 '
      .. '--resume_from_checkpoint '):format(dir)
    local out, rc = llama_run(args .. '--max_steps=3')
    assert.equals(0, rc, out)
    assert.matches('step 3: .*skip 2 of at most 3', out)
    out, rc = llama_run(args .. '--max_steps=8')
    assert.equals(nonfinite.EXIT_STATUS, rc, out)
    assert.matches('step 4: .*skip 3 of at most 3', out)
    assert.matches('step 5: .*stopped: 3 steps were skipped already %(%-%-max_nonfinite_skips=3%)', out)
    files.remove_tree(dir)
  end)

  it('guards t5, deepvit and mnist too, and rejects a bad --on_nonfinite', function()
    local runs = {
      { 'recipes/t5_3b.lua', '--model=tiny --num_layers=1 --d_model=32 --d_ff=64 --num_heads=2 --d_kv=16 '
        .. '--vocab_size=16 --batch_size=2 --max_steps=3 --warmup_steps=1 --eval_examples=2', 'shared.weight' },
      { 'recipes/deepvit_8b.lua', '--depth=1 --dim=32 --heads=2 --mlp_dim=64 --image_size=32 --num_classes=4 '
        .. '--max_steps=3 --batch_size=2', 'to_patch_embedding.weight' },
      { 'recipes/mnist.lua', '--epochs=1 --train_size=128 --test_size=64 --max_batches=3', 'fc1.weight' },
    }
    for _, r in ipairs(runs) do
      local out, rc = T.sh(('FSDP_TEST_NONFINITE_GRAD=2:%s timeout 120 %s %s %s'):format(r[3],
        T.quote(require('fsdp.host').exe), r[1], r[2]))
      assert.equals(nonfinite.EXIT_STATUS, rc, out)
      assert.matches(('fsdp%%-lua: %s: step 2: non%%-finite .*first parameter with a non%%-finite gradient: %s')
        :format(r[1]:gsub('%p', '%%%0'), r[3]:gsub('%p', '%%%0')), out)
      out, rc = T.run_script(r[1], r[2] .. ' --on_nonfinite=continue')
      assert.is_not.equals(0, rc)
      assert.matches("%-%-on_nonfinite must be one of stop, skip_step; got 'continue'", out)
    end
  end)
end)
