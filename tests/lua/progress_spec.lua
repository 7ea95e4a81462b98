-- progress_spec.lua: fsdp.observe.progress, the progress line of long work: the bar redrawn on a
-- terminal, the plain periodic lines in a log, the throttling that keeps a call per item cheap,
-- FSDP_PROGRESS=0, rank 0 only, and a checkpoint save reporting in a log.
local progress = require 'fsdp.observe.progress'
local dist = require 'fsdp.dist'
local T = require 'fsdp.testing'

-- A fake stream and clock: what was written, and time that moves only when told.
local function harness()
  local h = { t = 0, chunks = {}, flushes = 0 }
  h.out = {
    write = function(_, ...) for i = 1, select('#', ...) do h.chunks[#h.chunks + 1] = (select(i, ...)) end end,
    flush = function() h.flushes = h.flushes + 1 end,
  }
  h.now = function() return h.t end
  h.text = function() return table.concat(h.chunks) end
  return h
end

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

describe('fsdp.observe.progress', function()
  local interval
  before_each(function() interval = progress.interval end)
  after_each(function() progress.interval = interval end)

  it('redraws one bar on a terminal with percent, amounts, rate and ETA, ending with a summary line', function()
    local h = harness()
    local p = progress.start('saving', { total = 10 * 2^20, unit = 'B', mode = 'bar', out = h.out, now = h.now })
    for _ = 1, 4 do h.t = h.t + 0.5; p:add(2^20) end
    local mid = h.text()
    assert.truthy(mid:find('\r\27[K', 1, true))
    local want = 'saving  [=========>              ]   40%  4.0 MiB/10.0 MiB  2.0 MiB/s  ETA 3s'
    assert.truthy(mid:find(want, 1, true), mid)
    assert.is_nil(mid:find('\n', 1, true))             -- in place: no new line while running
    for _ = 1, 6 do h.t = h.t + 0.5; p:add(2^20) end
    p:finish()
    local last = h.text():match('\r\27%[K([^\r]*)$')
    assert.are.equal('saving: 10.0 MiB in 5.0 s (2.0 MiB/s)\n', last)
  end)

  it('throttles: a thousand updates within one redraw period draw once, and cost nothing measurable', function()
    local h = harness()
    local p = progress.start('loading', { total = 1000, unit = 'tensors', mode = 'bar', out = h.out, now = h.now })
    local draws = count(h.text(), '\r')
    for i = 1, 1000 do p:update(i) end                  -- the clock does not move
    assert.are.equal(draws, count(h.text(), '\r'))
    h.t = progress.redraw
    p:add(0)
    assert.are.equal(draws + 1, count(h.text(), '\r'))
    -- With the real clock: a million updates in well under a second.
    local real = progress.start('x', { total = 1e6, mode = 'lines', out = harness().out })
    local t0 = os.clock()
    for i = 1, 1e6 do real:update(i) end
    assert.is_true(os.clock() - t0 < 0.5, 'update is not cheap')
  end)

  it('writes plain lines every interval to a log, nothing for short work, a closing line after long work', function()
    progress.interval = 10
    local h = harness()
    local p = progress.start('tokenizing', { total = 100, unit = 'files', mode = 'lines', out = h.out, now = h.now })
    for _ = 1, 5 do h.t = h.t + 1; p:add(1) end     -- 5 s: under the interval
    p:finish()
    assert.are.equal('', h.text())                    -- short work adds nothing to a log
    h = harness()
    p = progress.start('tokenizing', { total = 100, unit = 'files', mode = 'lines', out = h.out, now = h.now })
    for _ = 1, 50 do h.t = h.t + 1; p:add(1) end    -- 50 s: lines at 10, 20, 30, 40, 50 s
    p:finish()
    local lines = {}
    for l in h.text():gmatch('([^\n]*)\n') do lines[#lines + 1] = l end
    assert.are.equal(6, #lines, h.text())
    assert.are.equal('tokenizing: 10%, 10/100 files, 1.0 files/s, ETA 1:30', lines[1])
    assert.are.equal('tokenizing: 50 files in 50s (1.0 files/s)', lines[6])
    assert.is_nil(h.text():find('\r', 1, true))
  end)

  it('announces a phase (one call that cannot report) and closes it with the elapsed time', function()
    local h = harness()
    local ph = progress.phase('training the tokenizer', { mode = 'lines', out = h.out, now = h.now })
    h.t = 28.3
    ph:finish('32,000 pieces')
    assert.are.equal('training the tokenizer ...\ntraining the tokenizer: done in 28s, 32,000 pieces\n', h.text())
  end)

  it('is off on ranks other than 0, and with FSDP_PROGRESS=0; =lines and =1 force a mode', function()
    local saved = dist.rank
    dist.rank = function() return 1 end
    local ok, mode = pcall(progress.mode)
    dist.rank = saved
    assert.is_true(ok, mode)
    assert.are.equal('off', mode)
    local h = harness()
    local off = progress.start('x', { total = 3, mode = 'off', out = h.out, now = h.now })
    off:add(1); off:update(3); off:finish()
    assert.are.equal('', h.text())
    local code = "io.write(require('fsdp.observe.progress').mode())"
    for env, want in pairs({ ['FSDP_PROGRESS=0'] = 'off', ['FSDP_PROGRESS=1'] = 'bar',
                             ['FSDP_PROGRESS=lines'] = 'lines', [''] = 'lines' }) do
      local out = T.sh(('%s %s -e %s 2>/dev/null'):format(env, T.quote(require('fsdp.host').exe), T.quote(code)))
      assert.are.equal(want, out, env)                -- (stderr is not a terminal here)
    end
  end)

  it('a checkpoint save reports its bytes in a log (integration)', function()
    local dir = T.tmpdir()
    local script = dir .. '/save.lua'
    local f = assert(io.open(script, 'w'))
    f:write([[
local fsdp = require 'fsdp'
local m = fsdp.nn.Sequential(fsdp.nn.Linear(64, 64), fsdp.nn.Linear(64, 8))
fsdp.checkpointing.save(arg[1], { model = m, step = 3 })
print('saved')
]])
    f:close()
    local rc, stdout, stderr = T.run_exe(('%s %s'):format(T.quote(script), T.quote(dir .. '/ck')), 60)
    -- without FSDP_PROGRESS_INTERVAL short work stays silent in a log
    assert.are.equal(0, rc, stderr)
    assert.are.equal('saved\n', stdout)
    assert.is_nil(stderr:find('checkpoint: saving', 1, true), stderr)
    local env_run = T.sh(('FSDP_PROGRESS=lines FSDP_PROGRESS_INTERVAL=0 %s %s %s 2>&1 >/dev/null'):format(
      T.quote(require('fsdp.host').exe), T.quote(script), T.quote(dir .. '/ck3')))
    -- (64x64+64 + 64x8+8) f32 = 18,720 bytes, the last line the summary
    assert.truthy(env_run:find('checkpoint: saving ' .. dir .. '/ck3/step-000003: 100%, 18.3 KiB/18.3 KiB', 1, true),
      env_run)
    assert.truthy(env_run:match('checkpoint: saving [^\n]*: 18%.3 KiB in [%d.]+ s %([^)]*/s%)\n$'), env_run)
    os.execute('rm -rf ' .. T.quote(dir))
  end)
end)
