-- outputs_spec.lua: failed writes to a run's outputs ([Note: failed output
-- writes] in fsdp.observe.outputs). Full disks without root: /dev/full
-- (every write fails with ENOSPC) and, in child processes, a file size
-- limit (ulimit -f, SIGXFSZ ignored: a write past it is short, then fails
-- with EFBIG), which cuts a record, an event, a trace or gnuplot's image
-- in the middle as a filling disk does. Checked: the appender's whole
-- records, one warning line per output, the output dropped, the run going
-- on and exiting 5, --on_output_error=stop, plots and traces. A real
-- tmpfs filling under a 2-rank recipe with checkpoints:
-- tests/mpi/output_errors.sh.
local fsdp = require 'fsdp'
local files = require 'fsdp.io.files'
local metrics = require 'fsdp.observe.metrics'
local tb = require 'fsdp.observe.tensorboard'
local run_shell = require('fsdp.testing').sh -- a shell command line: output and status
local host = require 'fsdp.host'
local cjson = require 'cjson'

local exe, q = host.exe, require('fsdp.quote').shell

local root = os.tmpname()
os.remove(root)
files.mkdir_p(root)
teardown(function() files.remove_tree(root) end)

-- Lua code in a child fsdp-lua whose files may not grow past `blocks` x
-- 512 bytes (dash's ulimit -f unit); its output and exit status.
local function limited(blocks, code)
  return run_shell(("sh -c %s"):format(q(("trap '' XFSZ; ulimit -f %d; exec %s -e %s"):format(blocks, q(exe),
    q(code)))))
end

-- A stream that keeps what is written to it (a Logger's err).
local function sink()
  local s = { text = '' }
  function s:write(...) for i = 1, select('#', ...) do self.text = self.text .. select(i, ...) end return self end
  function s:flush() end
  return s
end

local function quiet() return assert(io.open('/dev/null', 'w')) end

describe('checked appends', function()
  it('write whole records; a short write is cut off again and named', function()
    local path = root .. '/short.txt'
    local out, rc = limited(2, ([[
      local files = require 'fsdp.io.files'
      local a = files.appender(%q)
      a:write(('x'):rep(999) .. '\n')
      local ok, err = pcall(a.write, a, ('y'):rep(99) .. '\n')
      print(ok, err)
      a:close()
    ]]):format(path))
    assert.equal(0, rc, out)
    assert.truthy(out:find(path .. ': write failed after 24 of 100 bytes: File too large; the part written was '
      .. 'cut off again', 1, true), out)
    assert.equal(('x'):rep(999) .. '\n', files.read(path))
  end)

  it('fail on /dev/full naming it and errno', function()
    local a = files.appender('/dev/full')
    local ok, err = pcall(a.write, a, 'record\n')
    a:close()
    assert.is_false(ok)
    assert.matches('/dev/full: write failed after 0 of 7 bytes: No space left on device', err)
  end)
end)

describe('a Logger whose output fails', function()
  after_each(function() host.set_exit_status(0) end) -- this process's own status stays its tests'

  it('says so once, drops that output, trains on, and reports it at the end with exit status 5', function()
    local err = sink()
    local log = metrics.Logger({ total_steps = 3, batch_size = 1, metrics_file = '/dev/full', progress = false,
                                 out = quiet(), err = err })
    for s = 1, 3 do log:step(s, { loss = 1, lr = 0.1, dt = 0.1 }) end
    log:validation(3, 1.5)
    local lost = log:close()
    local lines = {}
    for l in err.text:gmatch('[^\n]+') do lines[#lines + 1] = l end
    assert.equal(2, #lines, err.text)
    assert.equal(1, lines[1]:find('fsdp-lua: warning: --metrics_file: writing step 1: /dev/full: write failed after '
      .. '0 of ', 1, true), lines[1])
    assert.matches('No space left on device; nothing more is written there; the run goes on and will exit with '
      .. 'status 5$', lines[1])
    assert.equal(1, lines[2]:find('fsdp-lua: output lost: --metrics_file /dev/full from step 1 (first failure: '
      .. '/dev/full: write failed after 0 of ', 1, true), lines[2])
    assert.matches('; exit status 5 at the end$', lines[2])
    assert.equal(1, #lost)
    assert.equal('metrics_file', lost[1].what)
    assert.equal(5, host.exit_status())
  end)

  it('leaves the exit status alone when every write succeeded', function()
    local path = root .. '/fine.jsonl'
    local err = sink()
    local log = metrics.Logger({ total_steps = 2, batch_size = 1, metrics_file = path, progress = false,
                                 out = quiet(), err = err })
    for s = 1, 2 do log:step(s, { loss = 1, lr = 0.1, dt = 0.1 }) end
    assert.same({}, log:close())
    assert.equal('', err.text)
    assert.equal(0, host.exit_status())
  end)

  it('keeps the metrics file and the event file whole when the disk fills mid-run; the process exits 5', function()
    local dir = root .. '/full'
    files.mkdir_p(dir)
    local out, rc = limited(16, ([[
      local metrics = require 'fsdp.observe.metrics'
      local log = metrics.Logger({ total_steps = 200, batch_size = 1, metrics_file = %q, tensorboard_dir = %q,
                                   progress = false, out = io.open('/dev/null', 'w') })
      for s = 1, 200 do log:step(s, { loss = 1 / s, lr = 0.1, dt = 0.1 }) end
      log:close()
      print('trained to the end')
    ]]):format(dir .. '/m.jsonl', dir .. '/tb'))
    assert.equal(5, rc, out)
    assert.truthy(out:find('trained to the end', 1, true), out)
    local _, warnings = out:gsub('fsdp%-lua: warning: ', '')
    assert.equal(2, warnings, out)
    local m_step = tonumber(out:match('warning: %-%-metrics_file: writing step (%d+): '))
    local tb_step = tonumber(out:match('warning: %-%-tensorboard_dir: writing step (%d+): '))
    assert.truthy(m_step and tb_step, out)
    -- every line a whole record, steps 1 .. the one before the failure
    local steps = {}
    for line in io.lines(dir .. '/m.jsonl') do steps[#steps + 1] = cjson.decode(line).step end
    assert.equal(m_step - 1, #steps)
    assert.equal(m_step - 1, steps[#steps])
    -- the event file reads back, CRCs checked, to the step before its failure
    local events = tb.read(tb.files(dir .. '/tb')[1])
    assert.equal(tb_step - 1, events[#events].step)
    assert.truthy(out:find('fsdp-lua: output lost: --metrics_file ' .. dir .. '/m.jsonl from step ' .. m_step
      .. ', --tensorboard_dir ' .. dir .. '/tb from step ' .. tb_step, 1, true), out)
  end)

  it('--on_output_error=stop ends the run after the step whose write failed, exit 5', function()
    local out, rc = run_shell(('%s -e %s'):format(q(exe), q([[
      local metrics = require 'fsdp.observe.metrics'
      local log = metrics.Logger({ total_steps = 5, batch_size = 1, metrics_file = '/dev/full', progress = false,
                                   on_output_error = 'stop', out = io.open('/dev/null', 'w') })
      for s = 1, 5 do log:step(s, { loss = 1, lr = 0.1, dt = 0.1 }); print('after step ' .. s) end
    ]])))
    assert.equal(5, rc, out)
    assert.truthy(out:find('the run stops after this step (--on_output_error=stop)', 1, true), out)
    assert.truthy(out:find('fsdp-lua: stopped after step 1: a write to an output failed (--on_output_error=stop): '
      .. '--metrics_file /dev/full from step 1\n', 1, true), out)
    assert.falsy(out:find('after step %d+\n'), out)
  end)

  it('a trace that cannot be written is said, left out whole, and the run goes on to exit 5', function()
    local dir = root .. '/trace'
    local out, rc = limited(4, ([[
      local fsdp = require 'fsdp'
      local metrics = require 'fsdp.observe.metrics'
      local log = metrics.Logger({ total_steps = 3, batch_size = 1, progress = false, profile_steps = '1:1',
                                   profile_dir = %q, out = io.open('/dev/null', 'w') })
      for s = 1, 3 do
        log:begin_step(s)
        local x = fsdp.ones({ 64, 64 })
        for _ = 1, 40 do x = x + 1 end
        log:step(s, { loss = 1, lr = 0.1, dt = 0.1 })
      end
      log:close()
      print('trained to the end')
    ]]):format(dir))
    assert.equal(5, rc, out)
    assert.truthy(out:find('trained to the end', 1, true), out)
    assert.truthy(out:find('fsdp-lua: warning: --profile_dir: ' .. dir .. '/trace-rank0.json.tmp.', 1, true), out)
    assert.truthy(out:find('cannot write: File too large', 1, true), out)
    assert.same({}, files.list(dir)) -- no part of it
  end)

  it('--plot: an image gnuplot could not write whole is a failure, not a plot', function()
    if select(2, run_shell('gnuplot --version')) ~= 0 then
      pending('gnuplot is not installed')
      return
    end
    local dir = root .. '/plot'
    files.mkdir_p(dir)
    local out, rc = limited(16, ([[
      local metrics = require 'fsdp.observe.metrics'
      local log = metrics.Logger({ total_steps = 5, batch_size = 1, metrics_file = %q, plot = true,
                                   progress = false, out = io.open('/dev/null', 'w') })
      for s = 1, 5 do log:step(s, { loss = 1 / s, lr = 0.1, dt = 0.1 }) end
      log:close()
    ]]):format(dir .. '/m.jsonl'))
    assert.equal(5, rc, out)
    assert.truthy(out:find('fsdp-lua: warning: --plot: gnuplot did not write ' .. dir .. '/m.png whole (', 1, true)
      or out:find('fsdp-lua: warning: --plot: gnuplot did not write ' .. dir .. '/m.svg whole (', 1, true), out)
    assert.truthy(out:find('fsdp-lua: output lost: --plot ' .. dir .. '/m.png', 1, true), out)
    assert.is_nil(files.mode(dir .. '/m.png')) -- a torn image is not left to pass for the plot
  end)
end)
