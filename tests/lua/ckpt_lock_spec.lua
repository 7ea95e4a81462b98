-- ckpt_lock_spec.lua: one job per checkpoint directory ([Note: one job per
-- checkpoint directory] in fsdp.checkpointing.lock), between this process
-- and child fsdp-lua processes: the holder's line, a second process
-- refused naming the holder, a clean release, a holder killed with
-- SIGKILL taken over by name, one lock through two paths, and a save into
-- a directory another process holds refused with the checkpoint there
-- intact. Whole jobs (2 ranks against a second job, kill -9 and resume, a
-- requeue) run in tests/mpi/ckpt_lock.sh.
local fsdp = require 'fsdp'
local core = require 'fsdp.core'
local files = require 'fsdp.io.files'
local lock = require 'fsdp.checkpointing.lock'
local ckpt = require 'fsdp.checkpointing'
local llama = require 'models.llama'
local run_shell = require('fsdp.testing').sh -- a shell command line: output and status
local C = core.C

local exe = require('fsdp.host').exe
local q = require('fsdp.quote').shell

local root = os.tmpname()
os.remove(root)
files.mkdir_p(root)
teardown(function() files.remove_tree(root) end)

local counter = 0
local function fresh_dir()
  counter = counter + 1
  return root .. '/d' .. counter
end

local function my_pid()
  local f = assert(io.open('/proc/self/stat'))
  local pid = f:read('*n')
  f:close()
  return pid
end

-- Run Lua code in a child fsdp-lua; its output and exit status.
local function child(code)
  return run_shell(('%s -e %s'):format(q(exe), q(code)))
end

local function lock_text(dir) return files.read(files.join(dir, lock.FILE)) or '' end

describe('checkpoint directory lock', function()
  it('writes the holder\'s line, and a second acquire in this process is the same lock', function()
    local dir = fresh_dir()
    local info = lock.acquire(dir)
    assert.equal(files.join(dir, 'LOCK'), info.path)
    assert.is_nil(info.taken_over)
    assert.matches('^host [^,]+, pid ' .. my_pid() .. ', since %d%d%d%d%-%d%d%-%d%d %d%d:%d%d:%d%d UTC, 1 rank\n$',
      lock_text(dir))
    assert.is_true(lock.holds(dir))
    assert.equal(info, lock.acquire(dir))
    lock.release(dir)
    assert.is_false(lock.holds(dir))
  end)

  it('refuses another process at once, naming this one, and leaves the lock file as it was', function()
    local dir = fresh_dir()
    lock.acquire(dir)
    local before = lock_text(dir)
    local t0 = require('fsdp.clock').now()
    local out, rc = child(('local ok, e = pcall(require("fsdp.checkpointing.lock").acquire, %q) '
      .. 'print(ok, e) os.exit(ok and 0 or 7)'):format(dir))
    local took = require('fsdp.clock').now() - t0
    assert.equal(7, rc)
    assert.truthy(out:find(('checkpoint directory %s is in use by another job (host '):format(dir), 1, true), out)
    assert.truthy(out:find((', pid %d, since '):format(my_pid()), 1, true), out)
    assert.is_true(took < 2, ('took %.2f s'):format(took))
    assert.equal(before, lock_text(dir))
    lock.release(dir)
  end)

  it('after a clean release the next process takes it with no takeover, and empties it when it ends', function()
    local dir = fresh_dir()
    lock.acquire(dir)
    lock.release(dir)
    assert.equal('', lock_text(dir))
    local out, rc = child(('local info = require("fsdp.checkpointing.lock").acquire(%q) '
      .. 'print("taken over: " .. tostring(info.taken_over))'):format(dir))
    assert.equal(0, rc, out)
    assert.truthy(out:find('taken over: nil', 1, true), out)
    assert.equal('', lock_text(dir)) -- the child let go as its state closed
  end)

  it('takes over the lock of a holder killed with SIGKILL, naming it', function()
    local dir = fresh_dir()
    -- (the status echoed from inside the command, so that the shell says
    -- "Killed" into the output rather than onto the test's terminal)
    local out = run_shell(('%s -e %s; echo "status $?"'):format(q(exe), q(('require("fsdp.checkpointing.lock")'
      .. '.acquire(%q) require("fsdp.checkpointing").kill_self("holding the lock")'):format(dir))))
    assert.truthy(out:find('status 137', 1, true), out)
    local pid = lock_text(dir):match('pid (%d+),')
    assert.truthy(pid, lock_text(dir))
    local info = lock.acquire(dir)
    assert.truthy(info.taken_over and info.taken_over:find(', pid ' .. pid .. ', ', 1, true), tostring(info.taken_over))
    assert.truthy(lock_text(dir):find(', pid ' .. my_pid() .. ', ', 1, true))
    lock.release(dir)
  end)

  it('is one lock through two paths to the same file', function()
    local dir = fresh_dir()
    files.mkdir_p(dir)
    local alias = dir .. '-alias'
    assert.equal(0, (os.execute(('ln -s %s %s'):format(q(dir), q(alias)))))
    local buf = core.ffi.new('char[64]')
    local a = C.fl_file_lock(dir .. '/LOCK', 'a', buf, 64)
    local b = C.fl_file_lock(alias .. '/LOCK', 'b', buf, 64)
    assert.is_true(a >= 0)
    assert.equal(a, b)
    core.check(C.fl_file_unlock(b))
    -- still held: one reference left
    local out, rc = child(('local ok = pcall(require("fsdp.checkpointing.lock").acquire, %q) '
      .. 'os.exit(ok and 0 or 7)'):format(dir))
    assert.equal(7, rc, out)
    core.check(C.fl_file_unlock(a))
    assert.are_not.equal(0, C.fl_file_unlock(a)) -- a handle released twice is refused
    assert.matches('is not a lock this process holds', core.last_error())
    C.fl_clear_error()
    os.remove(alias)
  end)

  it('a save into a directory another process holds fails naming it; the checkpoint there stays intact', function()
    local dir = fresh_dir()
    local m = llama.CausalLM(llama.config('Llama-2-7b', { dim = 32, n_layers = 1, n_heads = 4, n_kv_heads = 4, vocab_size = 32,
      ffn_dim = 64, max_seq_len = 16 }), { device = 'meta' })
    fsdp.shard(m, { seed = 1 })
    local step_dir = ckpt.save(dir, { model = m, step = 1 })
    lock.release(dir)
    -- A holder that keeps the lock until its standard input closes.
    local ready = dir .. '.ready'
    local holder = assert(io.popen(('%s -e %s'):format(q(exe), q(('require("fsdp.checkpointing.lock").acquire(%q) '
      .. 'io.open(%q, "w"):close() io.read("*a")'):format(dir, ready))), 'w'))
    for _ = 1, 200 do
      if files.mode(ready) then break end
      os.execute('sleep 0.05')
    end
    assert.truthy(files.mode(ready), 'the holder did not start')
    local ok, err = pcall(ckpt.save, dir, { model = m, step = 2 })
    holder:close()
    assert.is_false(ok)
    assert.truthy(tostring(err):find(('checkpoint directory %s is in use by another job (host '):format(dir), 1, true),
      tostring(err))
    assert.is_nil(files.mode(ckpt.directory.step_dir(dir, 2)))
    assert.truthy(ckpt.check(step_dir))
    assert.equal(step_dir, (ckpt.latest(dir)))
  end)
end)
