-- sweep_spec.lua: fsdp.sweep and recipes/sweep.lua: grids, outcomes of a
-- run, the CSV, and an 8-point sweep of a small Llama on CPU in fresh
-- processes with one point out of its memory limit, a CSV and a PNG chart;
-- the batch-size finder.
local sweep = require 'fsdp.sweep'
local clock = require 'fsdp.clock'

local T = require 'fsdp.testing'
local quote = T.quote

local read_file = require('fsdp.io.files').read

local tmp
setup(function() tmp = T.tmpdir() end)
teardown(function() if tmp then os.execute('rm -rf ' .. quote(tmp)) end end)

describe('fsdp.sweep grids', function()
  it('parses axes over any option and expands every combination', function()
    local axes = sweep.parse_grid('dtype=f32,bf16 activation-checkpointing=false,true;batch_size=2,4,8')
    assert.are.same({ 'dtype', 'activation_checkpointing', 'batch_size' },
      { axes[1].name, axes[2].name, axes[3].name })
    assert.are.same({ '2', '4', '8' }, axes[3].values)
    local points = sweep.points(axes)
    assert.are.equal(12, #points)
    assert.are.same({ dtype = 'f32', activation_checkpointing = 'false', batch_size = '2' }, points[1])
    assert.are.same({ dtype = 'f32', activation_checkpointing = 'false', batch_size = '4' }, points[2])
    assert.are.same({ dtype = 'bf16', activation_checkpointing = 'true', batch_size = '8' }, points[12])
    assert.are.same({ { name = 'sharding_strategy', values = { 'FULL_SHARD', 'NO_SHARD' } } },
      sweep.parse_grid('--sharding_strategy=FULL_SHARD,NO_SHARD'))
  end)

  it('names what is wrong with a grid', function()
    assert.error_matches(function() sweep.parse_grid('dtype') end, 'bad grid axis "dtype"')
    assert.error_matches(function() sweep.parse_grid('a=1 a=2') end, 'grid axis a is given twice')
    assert.error_matches(function() sweep.parse_grid('a=1,,2') end, 'grid axis a has an empty value')
    assert.error_matches(function() sweep.parse_grid('  ') end, 'the grid has no axes')
  end)
end)

describe('fsdp.sweep outcomes', function()
  it('reads the SUMMARY line, out of memory, timeouts and errors', function()
    local ok = sweep.classify('Batch 1 ...\nSUMMARY {"samples_per_s":12.5,"tflops":0.01,"peak_bytes":1048576}\n', 0)
    assert.are.same({ status = 'ok', samples_per_s = 12.5, tflops = 0.01, peak_bytes = 1048576 }, ok)
    local oom = sweep.classify('fsdp-lua: in model: empty: out of memory on cpu: requested 5 bytes\ntraceback', 1)
    assert.are.equal('oom', oom.status)
    assert.are.equal('out of memory on cpu: requested 5 bytes', oom.message)
    assert.are.equal('timeout', sweep.classify('Batch 1', 124).status)
    local err = sweep.classify('config...\nfsdp-lua: bad thing happened\nstack traceback:\n', 1)
    assert.are.equal('error', err.status)
    assert.are.equal('exit 1: bad thing happened', err.message)
    assert.are.equal('error', sweep.classify('finished\n', 0).status)
  end)

  it('writes CSV fields quoted where needed', function()
    assert.are.equal('plain', sweep.csv_field('plain'))
    assert.are.equal('"a,b"', sweep.csv_field('a,b'))
    assert.are.equal('"say ""hi"""', sweep.csv_field('say "hi"'))
  end)
end)

describe('recipes/sweep.lua', function()
  local small = '--num_layers=1 --hidden_width=32 --num_heads=2 --vocab_size=64 --seq_len=16'

  local function run(args)
    return T.run_script('recipes/sweep.lua', args)
  end

  it('runs 8 points in fresh processes, one out of memory, and writes a CSV and a chart', function()
    -- batch 128 needs more than the 2 MiB limit (bf16 at batch 64 fits
    -- where oneDNN runs its products: no f32 copies); batch 1 fits in every
    -- configuration.
    local out_dir = tmp .. '/sweep'
    local t0 = clock.now()
    local out, rc = run(('--grid=%s --args=%s --steps=1 --memory_limit_mb=2 --out=%s'):format(
      quote('dtype=f32,bf16 activation_checkpointing=false,true batch_size=1,128'), quote(small), quote(out_dir)))
    print(('# 8-point sweep: %.1f s'):format(clock.now() - t0))
    assert.are.equal(0, rc, out)
    assert.matches('sweep: 8 points', out, 1, true)
    local csv = read_file(out_dir .. '/sweep.csv')
    assert.is_string(csv, out)
    local lines = {}
    for line in csv:gmatch('[^\n]+') do lines[#lines + 1] = line end
    assert.are.equal(9, #lines)
    assert.are.equal('dtype,activation_checkpointing,batch_size,status,samples_per_s,tflops,peak_bytes,peak_mib,message',
      lines[1])
    local statuses = {}
    for i = 2, 9 do
      local dtype, ckpt, batch, status, sps, tflops, peak = lines[i]:match('^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)')
      statuses[#statuses + 1] = status
      if batch == '1' then
        assert.are.equal('ok', status, lines[i])
        assert.is_true(tonumber(sps) > 0)
        assert.is_true(tonumber(tflops) > 0)
        assert.is_true(tonumber(peak) > 0 and tonumber(peak) <= 2 * 2^20, lines[i])
      else
        assert.are.equal('128', batch)
        assert.are.equal('oom', status, lines[i])
        assert.matches('out of memory on cpu', lines[i], 1, true)
      end
      assert.is_truthy(dtype == 'f32' or dtype == 'bf16')
      assert.is_truthy(ckpt == 'false' or ckpt == 'true')
    end
    assert.are.same({ 'ok', 'oom', 'ok', 'oom', 'ok', 'oom', 'ok', 'oom' }, statuses)
    -- The table names the OOM points too.
    assert.matches('\n4%s+f32%s+true%s+128%s+oom%s+out of memory', out)
    local png = read_file(out_dir .. '/sweep.png')
    assert.is_string(png, 'no chart: ' .. out)
    assert.are.equal('\137PNG\r\n\26\n', png:sub(1, 8))
    assert.is_true(#png > 10000)
  end)

  it('finds the largest batch that fits, by real steps', function()
    local out, rc = run(('--find_batch --grid=dtype=f32 --args=%s --memory_limit_mb=2 --max_batch=256'):format(quote(small)))
    assert.are.equal(0, rc, out)
    local found = tonumber(out:match('dtype=f32: largest batch_size that fits: (%d+)'))
    assert.is_number(found, out)
    assert.is_true(found > 1 and found < 64, out)
    -- The probes bracket it: found fits, found + 1 does not.
    assert.matches(('batch_size=%d: ok'):format(found), out, 1, true)
    assert.matches(('batch_size=%d: oom'):format(found + 1), out, 1, true)
    -- The planner answered first (the recipe's --plan); its answer was the
    -- real one, so two probes settled it.
    local planned = tonumber(out:match('planned largest batch_size (%d+)'))
    assert.are.equal(found, planned, out)
    local _, probes = out:gsub('batch_size=%d+: %a+', '')
    assert.are.equal(2, probes, out)
    -- Without the planner: the same answer by doubling and bisecting.
    out, rc = run(('--find_batch --plan_first=false --grid=dtype=f32 --args=%s --memory_limit_mb=2 --max_batch=256')
      :format(quote(small)))
    assert.are.equal(0, rc, out)
    assert.are.equal(found, tonumber(out:match('largest batch_size that fits: (%d+)')), out)
  end)

  it('checks every point of the grid before running any', function()
    -- Point 2's heads do not divide the width: refused (exit 2) naming the
    -- point and the options, before point 1 ran (no CSV).
    local out_dir = tmp .. '/bad'
    local t0 = clock.now()
    local out, rc = run(('--grid=%s --args=%s --steps=1 --chart=false --out=%s'):format(
      quote('num_heads=2,3'), quote(small), quote(out_dir)))
    assert.are.equal(2, rc, out)
    assert.matches('grid point 2 of 2 (num_heads=3): --hidden_width (32) must be a multiple of --num_heads (3)', out, 1, true)
    assert.is_nil(read_file(out_dir .. '/sweep.csv'), out)
    assert.is_nil(out:find('Batch 1', 1, true), out)
    -- An option the recipe does not have fails every point alike: said once.
    out, rc = run(('--grid=%s --args=%s --out=%s'):format(quote('batch_size=1,2 num_layer=1,2'), quote(small),
      quote(out_dir)))
    assert.are.equal(2, rc, out)
    assert.matches('grid point 1 of 4 (batch_size=1 num_layer=1): unknown option --num_layer (did you mean '
      .. '--num_layers?) (and 3 more points)', out, 1, true)
    print(('# two grids refused in %.2f s'):format(clock.now() - t0))
  end)

  it('records a point that fails while running, goes on, and exits 1', function()
    -- A recipe whose --fail point passes the checks and fails when run.
    local script = tmp .. '/flaky.lua'
    local f = assert(io.open(script, 'w'))
    f:write([[
local cfg = require('fsdp.options').config({
  fail = { false, 'fail while running' }, max_steps = { 1, 'steps', int = true, min = 1 },
  warmup_steps = { 0, 'warmup' }, log_every = { 1, 'log' }, summary = { false, 'summary' },
  skip_fit_check = { false, 'no fit check' },
}, arg, 'flaky.lua')
if cfg.fail then error('failed while running') end
print('SUMMARY {"samples_per_s": 2, "tflops": 0, "peak_bytes": 1048576}')
]])
    f:close()
    local out_dir = tmp .. '/flaky'
    local out, rc = run(('--recipe=%s --grid=fail=false,true --args= --steps=1 --chart=false --out=%s'):format(
      quote(script), quote(out_dir)))
    assert.are.equal(1, rc, out)
    assert.matches('1 of 2 points failed', out, 1, true)
    local csv = read_file(out_dir .. '/sweep.csv')
    assert.matches('\nfalse,ok,', csv)
    assert.matches('\ntrue,error,[^\n]*failed while running', csv)
  end)

  it('names bad options', function()
    local out, rc = run('--grid=dtype')
    assert.are.equal(2, rc)
    assert.matches('bad grid axis "dtype"', out, 1, true)
    out, rc = run('--find_batch')
    assert.are.equal(2, rc)
    assert.matches('--find_batch needs --memory_limit_mb', out, 1, true)
    out, rc = run('--recipe=recipes/nope.lua')
    assert.are.equal(2, rc)
    assert.matches('recipe recipes/nope.lua not found', out, 1, true)
  end)
end)
