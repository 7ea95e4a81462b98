-- checkpointing_spec.lua: sharded checkpoints in one process (world of one
-- rank): a save/load round trip that continues training bit for bit
-- (parameters, optimizer state, schedule, data position, RNG), unsharded
-- models, atomic files that leave no temporary files behind, torn step
-- directories skipped by latest(), keep-last-K, clear errors for damaged
-- or mismatched checkpoints (naming the file, the field or the parameter),
-- exact numbers in index.json, and the full state dict; integrity: a
-- damaged, stale or foreign rank file refused by name with resume falling
-- back to the previous intact checkpoint, saves refusing NaN, pruning that
-- never follows a link nor deletes a stray file. Multi-rank saves,
-- resharding, swapped rank files and crash/restart run under mpirun
-- (tests/mpi/ckpt_*).
local fsdp = require 'fsdp'
local llama = require 'models.llama'
local optim = require 'fsdp.optim'
local ckpt = require 'fsdp.checkpointing'
local files = require 'fsdp.io.files'
local json = require 'fsdp.io.json'
local synthetic_tokens = require 'fsdp.data.synthetic_tokens'
local ckpt_options = require 'fsdp.checkpointing.options'
local lfs = require 'lfs'

local CFG = { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 64,
              max_seq_len = 32 }

local root = os.tmpname()
os.remove(root)
files.mkdir_p(root)
teardown(function() files.remove_tree(root) end) -- link-safe: never leaves root

local counter = 0
local function fresh_dir()
  counter = counter + 1
  return root .. '/c' .. counter
end

local function no_decay(_, p) return #(rawget(p, 'fsdp_shape') or p.shape) < 2 end

-- A model (sharded unless plain), AdamW with two groups, a schedule and data.
local function setup(opts)
  opts = opts or {}
  local m = llama.CausalLM(llama.config('Llama-2-7b', CFG), { device = 'meta' })
  if opts.plain then
    m:init_weights({ seed = 4, device = 'cpu' })
  else
    fsdp.shard(m, { policy = fsdp.policy.transformer { llama.DecoderLayer }, seed = 4 })
  end
  local opt = optim.AdamW(m:named_parameters(), { lr = 1e-2, weight_decay = 0.1,
    groups = { { match = no_decay, weight_decay = 0 } } })
  local sched = optim.lr_scheduler.WarmupCosine(opt, { warmup_steps = 2, total_steps = 10, min_lr = 1e-3 })
  local data = synthetic_tokens.new(CFG.vocab_size, { batch_size = 2, seq_len = 16, seed = 0 })
  return { model = m, optimizer = opt, scheduler = sched, data = data }
end

-- One training step; returns the loss.
local function step(s)
  local ids, tg = s.data:next()
  local loss = s.model:loss(ids, tg)
  loss:backward()
  if rawget(s.model, '_fsdp') then fsdp.clip_grad_norm(s.model, 1.0) end
  s.optimizer:step()
  s.scheduler:step()
  s.optimizer:zero_grad()
  return loss:item()
end

local function params(m)
  if rawget(m, '_fsdp') then return fsdp.full_state_dict(m) end
  local out = {}
  for _, np in ipairs(m:named_parameters()) do out[np[1]] = np[2] end
  return out
end

local function assert_same(a, b)
  local n = 0
  for name, t in pairs(a) do
    assert.is_not_nil(b[name], name)
    assert.equals(0, (t - b[name]):abs():max():item(), name)
    n = n + 1
  end
  assert.is_true(n > 0)
end

local function has_temp_files(dir)
  for _, name in ipairs(files.list(dir)) do
    if name:find('.tmp.', 1, true) then return true end
    if files.mode(files.join(dir, name)) == 'directory' and has_temp_files(files.join(dir, name)) then return true end
  end
  return false
end

describe('sharded checkpoints, one rank', function()
  it('resume continues training bit for bit: parameters, optimizer, schedule, data, RNG', function()
    local dir = fresh_dir()
    local a = setup()
    for _ = 1, 3 do step(a) end
    fsdp.manual_seed(5)
    fsdp.rand({ 3 }) -- the RNG moved on: its position is saved
    local path = ckpt.save(dir, { model = a.model, optimizer = a.optimizer, scheduler = a.scheduler,
                                  data = a.data, step = 3, extra = { note = 'hi', lr = 0.1 + 0.2 } })
    assert.equals(dir .. '/step-000003', path)
    local want_rng = fsdp.rand({ 4 })
    local want = {}
    for i = 1, 3 do want[i] = step(a) end

    local b = setup()
    fsdp.manual_seed(0)
    local info = ckpt.load(dir, b)
    assert.equals(3, info.step)
    assert.equals('hi', info.extra.note)
    assert.equals(0.1 + 0.2, info.extra.lr) -- exact, not 14 digits
    assert.equals(3, b.scheduler.last_step)
    assert.equals(3, b.data:state().step)
    assert.equals(0, (fsdp.rand({ 4 }) - want_rng):abs():max():item())
    for i = 1, 3 do assert.equals(want[i], step(b)) end
    assert_same(params(a.model), params(b.model))
  end)

  it('restores the optimizer state of every parameter and the hyper-parameters', function()
    local dir = fresh_dir()
    local a = setup()
    for _ = 1, 2 do step(a) end
    ckpt.save(dir, { model = a.model, optimizer = a.optimizer, step = 2 })
    local b = setup()
    b.optimizer.param_groups[1].weight_decay = 0.5 -- the saved one wins
    ckpt.load(dir, { model = b.model, optimizer = b.optimizer })
    assert.equals(0.1, b.optimizer.param_groups[1].weight_decay)
    for name, st in pairs(a.optimizer.state) do
      local got = b.optimizer.state[name]
      assert.is_not_nil(got, name)
      assert.equals(st.step, got.step)
      assert.equals(0, (st.exp_avg - got.exp_avg):abs():max():item(), name)
      assert.equals(0, (st.exp_avg_sq - got.exp_avg_sq):abs():max():item(), name)
    end
  end)

  it('works for a model that is not sharded (whole parameters, state shaped like them)', function()
    local dir = fresh_dir()
    local a = setup({ plain = true })
    for _ = 1, 2 do step(a) end
    ckpt.save(dir, { model = a.model, optimizer = a.optimizer, scheduler = a.scheduler, data = a.data, step = 2 })
    local want = step(a)
    local b = setup({ plain = true })
    ckpt.load(dir, b)
    local st = b.optimizer.state['model.layers.0.mlp.up_proj.weight']
    assert.same({ 64, 32 }, st.exp_avg.shape)
    assert.equals(want, step(b))
    -- and a plain checkpoint loads into a sharded model
    local c = setup()
    ckpt.load(dir, c)
    assert.equals(want, step(c))
  end)

  it('writes atomically: no temporary files, a failed write leaves the old file', function()
    local dir = fresh_dir()
    local a = setup()
    step(a)
    ckpt.save(dir, { model = a.model, optimizer = a.optimizer, step = 1 })
    assert.is_false(has_temp_files(dir))
    assert.same({ 'COMPLETE', 'index.json', 'rank-00000-of-00001.safetensors' }, files.list(dir .. '/step-000001'))
    local f = dir .. '/x.txt'
    files.write_atomic(f, 'old')
    files.write_atomic(f, 'new contents')
    assert.equals('new contents', files.read(f))
    local ok, err = pcall(files.write_atomic, dir .. '/missing/x.txt', 'x')
    assert.is_false(ok)
    assert.matches('missing/x.txt.tmp.%d+: cannot create', err)
    assert.is_false(has_temp_files(dir))
  end)

  it('latest() skips a torn step directory (no COMPLETE) and reports it; load refuses it by name', function()
    local dir = fresh_dir()
    local a = setup()
    step(a)
    ckpt.save(dir, { model = a.model, step = 1 })
    ckpt.save(dir, { model = a.model, step = 2 })
    os.remove(dir .. '/step-000002/COMPLETE') -- a save that died before its marker
    files.mkdir_p(dir .. '/step-000003')       -- one that died at once
    local path, s, skipped = ckpt.latest(dir)
    assert.equals(dir .. '/step-000001', path)
    assert.equals(1, s)
    assert.same({ dir .. '/step-000002', dir .. '/step-000003' }, skipped)
    assert.equals(1, ckpt.load(dir, { model = setup().model }).step)
    local ok, err = pcall(ckpt.load, dir .. '/step-000002', { model = setup().model })
    assert.is_false(ok)
    assert.matches('step%-000002 has no COMPLETE', err)
    assert.is_nil(ckpt.latest(root .. '/nothing-here'))
  end)

  it('keeps the newest K complete checkpoints and removes older torn ones', function()
    local dir = fresh_dir()
    local a = setup()
    files.mkdir_p(dir .. '/step-000000') -- a torn save from an earlier run
    for s = 1, 5 do ckpt.save(dir, { model = a.model, step = s, keep = 2 }) end
    -- (LOCK: the directory's owner, fsdp.checkpointing.lock; pruning leaves it)
    assert.same({ 'LOCK', 'step-000004', 'step-000005' }, files.list(dir))
    -- saving a step again replaces its directory
    ckpt.save(dir, { model = a.model, step = 5, keep = 2 })
    assert.same({ 'LOCK', 'step-000004', 'step-000005' }, files.list(dir))
  end)

  it('names the file and the problem for a damaged or missing index or rank file', function()
    local dir = fresh_dir()
    local a = setup()
    ckpt.save(dir, { model = a.model, step = 1 })
    local sd = dir .. '/step-000001'
    local index = files.read(sd .. '/index.json')
    local function load_error()
      local ok, err = pcall(ckpt.load, sd, { model = setup().model })
      assert.is_false(ok)
      return err
    end
    files.write_atomic(sd .. '/index.json', index:sub(1, 100))
    assert.matches('index ' .. sd:gsub('%p', '%%%0') .. '/index.json: not valid JSON', load_error())
    files.write_atomic(sd .. '/index.json', '{"format": "something else"}')
    assert.matches('not a sharded checkpoint index', load_error())
    local doc = json.decode(index)
    doc.parts[1].shards[1].rank = 7
    files.write_atomic(sd .. '/index.json', json.encode(doc))
    assert.matches('parts%[1%] %(unit:model.layers.0%).shards%[1%].rank 7 is not below world_size 1', load_error())
    os.remove(sd .. '/index.json')
    local ok, err = pcall(ckpt.load, sd, { model = setup().model })
    assert.is_false(ok)
    assert.matches('holds no complete checkpoint', err) -- without an index it is no step directory
    files.write_atomic(sd .. '/index.json', index)
    os.rename(sd .. '/rank-00000-of-00001.safetensors', sd .. '/moved')
    assert.matches('rank%-00000%-of%-00001.safetensors is missing %(rank 0 of 1 saved it%)', load_error())
  end)

  it('refuses a checkpoint of another model, naming the parameter', function()
    local dir = fresh_dir()
    local a = setup()
    ckpt.save(dir, { model = a.model, step = 1 })
    local cfg = {}
    for k, v in pairs(CFG) do cfg[k] = v end
    cfg.ffn_dim = 96
    local other = llama.CausalLM(llama.config('Llama-2-7b', cfg), { device = 'meta' })
    fsdp.shard(other, { seed = 1 })
    local ok, err = pcall(ckpt.load, dir, { model = other })
    assert.is_false(ok)
    assert.matches('parameter model.layers.0.mlp.gate_proj.weight is %[64, 32%] in the checkpoint, %[96, 32%] in the model', err)
    cfg.ffn_dim, cfg.n_layers = 64, 3
    local deeper = llama.CausalLM(llama.config('Llama-2-7b', cfg), { device = 'meta' })
    fsdp.shard(deeper, { seed = 1 })
    ok, err = pcall(ckpt.load, dir, { model = deeper })
    assert.is_false(ok)
    assert.matches('lacks parameters of the model: model.layers.2', err)
  end)

  it('save_full_state_dict writes the whole model under its names, equal to full_state_dict', function()
    local a = setup()
    step(a)
    local path = root .. '/full.safetensors'
    fsdp.save_full_state_dict(path, a.model)
    local got = fsdp.load_safetensors(path)
    assert_same(fsdp.full_state_dict(a.model), got)
    local p = setup({ plain = true })
    fsdp.save_full_state_dict(root .. '/plain.safetensors', p.model)
    assert_same(params(p.model), fsdp.load_safetensors(root .. '/plain.safetensors'))
  end)

  it('json: exact numbers, sorted keys, arrays even when empty', function()
    local v = { lr = 0.1 + 0.2, big = 2 ^ 52 + 1, shape = json.array({}), nested = { { a = 1 }, { b = -1.5e-300 } } }
    local back = json.decode(json.encode(v))
    assert.equals(0.1 + 0.2, back.lr)
    assert.equals(2 ^ 52 + 1, back.big)
    assert.equals(-1.5e-300, back.nested[2].b)
    assert.matches('"shape": %[%]', json.encode(v))
    assert.has_error(function() json.encode({ x = 0 / 0 }) end, 'json.encode: $.x is nan, which JSON cannot hold')
  end)
end)

describe('checkpoint integrity, one rank', function()
  local RANK = 'rank-00000-of-00001.safetensors'

  local function pat(s) return (s:gsub('%p', '%%%0')) end

  local function overwrite(path, bytes)
    local f = assert(io.open(path, 'wb'))
    f:write(bytes)
    f:close()
  end

  -- Steps 1..4 of one run with checkpoints after 2 and 4, and the losses
  -- of steps 3 and 4 (what a resume from step 2 must log again).
  local function two_checkpoints(dir)
    local a = setup()
    for _ = 1, 2 do step(a) end
    ckpt.save(dir, { model = a.model, optimizer = a.optimizer, scheduler = a.scheduler, data = a.data, step = 2 })
    local want = { step(a), step(a) }
    ckpt.save(dir, { model = a.model, optimizer = a.optimizer, scheduler = a.scheduler, data = a.data, step = 4 })
    return want
  end

  -- The step-4 checkpoint is refused naming its rank file and `reason`;
  -- --resume_from_checkpoint falls back to step 2 and steps 3, 4 repeat
  -- the uninterrupted run's losses.
  local function refused_and_fallback(dir, want, reason)
    local sd = dir .. '/step-000004'
    local ok, err = pcall(ckpt.load, sd, setup())
    assert.is_false(ok)
    assert.matches('checkpointing.load: refused: checkpoint ' .. pat(sd) .. ': ' .. pat(sd .. '/' .. RANK) .. ':? ' .. reason, err)
    local b = setup()
    local cfg = { checkpoint_dir = dir, resume_from_checkpoint = true, checkpoint_freq = 0 }
    assert.equals(2, ckpt_options.resume(cfg, b))
    assert.same(want, { step(b), step(b) })
  end

  it('a flipped bit in a rank file is refused by name; resume falls back to the previous checkpoint', function()
    local dir = fresh_dir()
    local want = two_checkpoints(dir)
    local path = dir .. '/step-000004/' .. RANK
    local bytes = files.read(path)
    local at = #bytes - 1000 -- inside the tensor data
    overwrite(path, bytes:sub(1, at - 1) .. string.char(bit.bxor(bytes:byte(at), 4)) .. bytes:sub(at + 1))
    refused_and_fallback(dir, want, 'the tensor data is damaged: it hashes to xxh3%-64:%x+, the file records xxh3%-64:%x+')
  end)

  it('a rank file from an older step is refused as stale; resume falls back', function()
    local dir = fresh_dir()
    local want = two_checkpoints(dir)
    overwrite(dir .. '/step-000004/' .. RANK, files.read(dir .. '/step-000002/' .. RANK))
    refused_and_fallback(dir, want, 'is from step 2, not step 4 %(a stale file%)')
  end)

  it('a rank file of another run is refused; resume falls back', function()
    local dir, other = fresh_dir(), fresh_dir()
    local want = two_checkpoints(dir)
    local a = setup()
    ckpt.save(other, { model = a.model, optimizer = a.optimizer, scheduler = a.scheduler, data = a.data, step = 4,
                       run = 'another-run' })
    overwrite(dir .. '/step-000004/' .. RANK, files.read(other .. '/step-000004/' .. RANK))
    refused_and_fallback(dir, want, 'is from another run %(another%-run; this checkpoint is run %x+%)')
    -- a run id is kept across resumes: the next save is the same run's
    assert.equals(json.decode(files.read(dir .. '/step-000002/index.json')).run, ckpt.run_id())
  end)

  it('resume stops, naming every refused checkpoint, when none is intact', function()
    local dir = fresh_dir()
    two_checkpoints(dir)
    for _, s in ipairs({ 2, 4 }) do os.remove(('%s/step-%06d/%s'):format(dir, s, RANK)) end
    local cfg = { checkpoint_dir = dir, resume_from_checkpoint = true, checkpoint_freq = 0 }
    local ok, err = pcall(ckpt_options.resume, cfg, setup())
    assert.is_false(ok)
    assert.matches('no intact checkpoint in ' .. pat(dir) .. ' %(refused: .*step%-000004, .*step%-000002%)', err)
  end)

  it('a save refuses NaN in the optimizer state or parameters: no COMPLETE, the error names step and tensor', function()
    local dir = fresh_dir()
    local a = setup()
    step(a)
    ckpt.save(dir, { model = a.model, optimizer = a.optimizer, step = 1, keep = 1 })
    step(a)
    local name = 'model.layers.1.mlp.up_proj.weight'
    a.optimizer.state[name].exp_avg:narrow(0, 3, 1):fill_(0 / 0)
    local ok, err = pcall(ckpt.save, dir, { model = a.model, optimizer = a.optimizer, step = 2, keep = 1 })
    assert.is_false(ok)
    assert.matches("step 2 not saved %(rank 0 failed%): .*tensor 'unit:model.layers.1#exp_avg' is not finite", err)
    assert.is_nil(files.lmode(dir .. '/step-000002/COMPLETE'))
    assert.is_true(ckpt.directory.is_complete(dir .. '/step-000001')) -- the last finite checkpoint is kept
    a.optimizer.state[name].exp_avg:fill_(0)
    a.model.model.norm.weight:fill_(1 / 0)
    ok, err = pcall(ckpt.save, dir, { model = a.model, optimizer = a.optimizer, step = 3, keep = 1 })
    assert.is_false(ok)
    assert.matches("step 3 not saved .*tensor 'unit:.*' is not finite %(element %d+ is NaN or infinite%)", err)
    assert.same({ 'LOCK', 'step-000001', 'step-000002', 'step-000003' }, files.list(dir))
  end)

  it('pruning never follows a link, leaves stray entries, and later saves succeed', function()
    local dir, outside = fresh_dir(), fresh_dir()
    files.mkdir_p(outside .. '/sub')
    for _, f in ipairs({ 'index.json', RANK, 'COMPLETE', 'sub/victim' }) do files.write_atomic(outside .. '/' .. f, 'keep me') end
    local a = setup()
    step(a)
    ckpt.save(dir, { model = a.model, step = 1 })
    local s1 = dir .. '/step-000001'
    -- links inside a step directory, named like its own files and not
    assert.is_true(lfs.link(outside .. '/' .. RANK, s1 .. '/' .. RANK .. '.tmp.77', true))
    assert.is_true(lfs.link(outside .. '/sub', s1 .. '/sub', true))
    assert.is_true(lfs.link(outside .. '/index.json', s1 .. '/index.json.tmp.5', true))
    files.write_atomic(s1 .. '/notes.txt', 'mine')
    -- links as step directories, complete and not; a stray file in an incomplete one
    assert.is_true(lfs.link(outside, dir .. '/step-000002', true))
    assert.is_true(lfs.link(outside .. '/sub', dir .. '/step-000000', true))
    files.mkdir_p(dir .. '/step-000003')
    files.write_atomic(dir .. '/step-000003/user.txt', 'mine')
    files.write_atomic(dir .. '/step-000003/' .. RANK .. '.tmp.9', 'a killed writer\'s')
    for s = 4, 7 do ckpt.save(dir, { model = a.model, step = s, keep = 1 }) end
    for _, f in ipairs({ 'index.json', RANK, 'COMPLETE', 'sub/victim' }) do
      assert.equals('keep me', files.read(outside .. '/' .. f), f)
    end
    assert.same({ 'index.json.tmp.5', 'notes.txt', RANK .. '.tmp.77', 'sub' }, files.list(s1))
    assert.equals('link', files.lmode(dir .. '/step-000002'))
    assert.same({ 'user.txt' }, files.list(dir .. '/step-000003'))
    local s = ckpt.directory.scan(dir)
    assert.equals(1, #s.complete)
    assert.equals(7, s.complete[1].step)
    -- a link where a save's own step directory goes is moved aside, not followed
    assert.is_true(lfs.link(outside, dir .. '/step-000008', true))
    ckpt.save(dir, { model = a.model, step = 8, keep = 1 })
    assert.is_true(ckpt.directory.is_complete(dir .. '/step-000008'))
    assert.equals('keep me', files.read(outside .. '/COMPLETE'))
    assert.same({ 'COMPLETE', 'index.json', RANK, 'sub' }, files.list(outside))
    assert.equals(8, ckpt.load(dir, { model = setup().model }).step)
  end)

  it('full state dicts carry a checksum that loads verify; other files load as before', function()
    local a = setup()
    step(a)
    local path = root .. '/checked.safetensors'
    fsdp.save_full_state_dict(path, a.model)
    local f = require('fsdp.io.safetensors').open(path)
    assert.matches('^xxh3%-64:%x+$', f:metadata().fsdp_checksum)
    assert.equals('pt', f:metadata().format)
    assert.is_true(f:verify())
    f:close()
    local bytes = files.read(path)
    overwrite(path, bytes:sub(1, -9) .. string.char(bit.bxor(bytes:byte(-8), 1)) .. bytes:sub(-7))
    local ok, err = pcall(fsdp.load_safetensors, path)
    assert.is_false(ok)
    assert.matches(pat(path) .. ': the tensor data is damaged', err)
    ok, err = pcall(fsdp.load_safetensors_into, setup().model, path)
    assert.is_false(ok)
    assert.matches(pat(path) .. ': the tensor data is damaged', err)
    -- without the option: no checksum, nothing to verify (a checksum
    -- copied in with the metadata of another file is dropped)
    local plain = root .. '/plain-nock.safetensors'
    fsdp.save_safetensors(plain, { w = fsdp.ones({ 3 }) }, { fsdp_checksum = 'xxh3-64:0123456789abcdef' })
    local g = require('fsdp.io.safetensors').open(plain)
    assert.is_nil(g:metadata().fsdp_checksum)
    assert.is_false(g:verify())
    g:close()
    ok, err = pcall(fsdp.save_safetensors, plain, { w = fsdp.tensor({ 1, 0 / 0 }) }, nil, { finite = true })
    assert.is_false(ok)
    assert.matches("tensor 'w' is not finite %(element 1 is NaN or infinite%)", err)
  end)
end)

describe('a recipe whose save cannot be written', function()
  it('stops with one line naming the step, why and the newest checkpoint, exit 1; that checkpoint intact', function()
    -- A file size limit (SIGXFSZ ignored) cuts a rank file part way, as a
    -- disk filling up would: a first run without it saves step 1; the same
    -- command resumed under a limit a little below one rank file's size
    -- cannot write step 2's.
    local dir = fresh_dir()
    local run_shell = require('fsdp.testing').sh -- a shell command line: output and status
    local q = require('fsdp.quote').shell
    local cmd = function(steps, blocks)
      return ("sh -c %s"):format(q(("trap '' XFSZ; ulimit -f %s; exec %s recipes/llama2_7b.lua --num_layers=1 "
        .. '--hidden_width=32 --num_heads=4 --vocab_size=64 --batch_size=2 --seq_len=16 --warmup_steps=0 '
        .. '--validation_freq=0 --checkpoint_dir=%s --checkpoint_freq=1 --keep_checkpoints=0 --resume_from_checkpoint '
        .. '--max_steps=%d'):format(blocks, q(require('fsdp.host').exe), q(dir), steps)))
    end
    local out, rc = run_shell(cmd(1, 'unlimited'))
    assert.equal(0, rc, out)
    local rank_file = dir .. '/step-000001/rank-00000-of-00001.safetensors'
    local blocks = math.floor(files.size(rank_file) / 512) - 1 -- a few hundred bytes short of one rank file
    out, rc = run_shell(cmd(2, blocks))
    assert.equal(1, rc, out)
    local _, lines = out:gsub('fsdp%-lua: ', '')
    assert.equal(1, lines, out)
    assert.truthy(out:find(('fsdp-lua: checkpoint: step 2 not saved (rank 0 failed): %s/step-000002/'):format(dir), 1,
      true), out)
    assert.truthy(out:find(('File too large; the newest checkpoint is %s/step-000001\n'):format(dir), 1, true), out)
    assert.is_nil(out:find('traceback', 1, true))
    assert.is_false(ckpt.directory.is_complete(dir .. '/step-000002'))
    assert.truthy(ckpt.check(dir .. '/step-000001'))
  end)
end)
