-- plan_repl_spec.lua: the planner from the REPL on a real terminal (tmux):
-- build Llama-2-70B on meta, print it, summarise it and plan it for 64
-- GPUs with FULL_SHARD and bf16, all typed at the prompt; the per-rank
-- memory must show and the whole takes under 5 seconds (timed inside the
-- REPL). Skipped with a message when tmux is missing. Every wait is
-- bounded, and the tmux server is private to the test.
local host = require 'fsdp.host'

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function sh(cmd)
  local f = assert(io.popen('(' .. cmd .. ') 2>&1; echo "@rc=$?"'))
  local out = f:read('*a')
  f:close()
  local body, rc = out:match('^(.-)@rc=(%d+)\n?$')
  return body or out, tonumber(rc)
end

local read_file = require('fsdp.io.files').read

describe('the planner in the REPL', function()
  local have_tmux = select(2, sh('command -v tmux')) == 0
  local dir, socket

  local function tmux(args)
    return sh('env -u TMUX tmux -S ' .. quote(socket) .. ' -f /dev/null ' .. args)
  end

  -- The whole pane, scrolled-off lines included, polled until it shows
  -- `text` (at most `seconds`).
  local function wait_in_history(text, seconds)
    local s
    for _ = 1, (seconds or 20) * 10 do
      s = tmux('capture-pane -p -J -S - -t plan')
      if s:find(text, 1, true) then return s end
      os.execute('sleep 0.1')
    end
    error(('timed out waiting for %q on the terminal:\n%s'):format(text, s))
  end

  local function type_line(line)
    tmux('send-keys -t plan -l ' .. quote(line))
    tmux('send-keys -t plan Enter')
  end

  before_each(function()
    if not have_tmux then return end
    dir = (sh('mktemp -d')):gsub('%s+$', '')
    socket = dir .. '/tmux.sock'
    local cmd = ('env HOME=%s LANG=C.UTF-8 %s; echo $? > %s'):format(quote(dir), quote(host.exe),
      quote(dir .. '/rc'))
    local out, rc = tmux('new-session -d -x 120 -y 50 -s plan ' .. quote(cmd))
    assert.are.equal(0, rc, out)
    tmux('set-option -t plan history-limit 20000')
  end)

  after_each(function()
    if not have_tmux then return end
    tmux('kill-server')
    os.execute('rm -rf ' .. quote(dir))
  end)

  it('builds, prints, summarises and plans Llama-2-70B for 64 GPUs in under 5 s', function()
    if not have_tmux then pending('tmux is not installed: the REPL on a terminal is not tested') return end
    wait_in_history('Ctrl-D exits')
    type_line("t0 = require('fsdp.clock').now()")
    type_line("m = require('models.llama').build('llama2_70b', {device = 'meta'})")
    type_line('m')
    type_line('s = fsdp.summary(m)')
    type_line("p = fsdp.plan(m, {world = 64, nodes = 8, strategy = 'FULL_SHARD', mixed_precision = 'bf16', "
      .. "device = 'h100-80g', batch = 1, seq = 4096, checkpoint = true})")
    type_line('p')
    type_line("print(('ELAP' .. 'SED %.3f s'):format(require('fsdp.clock').now() - t0))")
    local text = wait_in_history('ELAPSED ')
    local seconds = tonumber(text:match('ELAPSED ([%d.]+) s'))
    print(('# REPL: Llama-2-70B built on meta, printed, summarised and planned for 64 GPUs in %.3f s'):format(seconds))
    assert.is_truthy(text:find('(0-79): 80 x LlamaDecoderLayer(', 1, true), text)
    assert.is_truthy(text:find('total: 68,976,648,192 parameters', 1, true), text)
    -- The per-rank memory of the plan: 68,976,648,192 x 4 bytes / 64 ranks
    -- of f32 shards = 4.015 GiB, the same of gradients, twice that of AdamW.
    for _, needle in ipairs({ 'per-rank memory', 'parameters (f32 shards)', '4.015',
                              'optimizer state (AdamW)', '8.030', 'peak', 'FITS:', 'all_gather' }) do
      assert.is_truthy(text:find(needle, 1, true), ('%q not on the terminal:\n%s'):format(needle, text))
    end
    -- The bound only where the build is not slowed down by sanitizers.
    if not host.build_info:find('asan', 1, true) then assert.is_true(seconds < 5, text) end
    tmux('send-keys -t plan C-d')
    for _ = 1, 100 do
      if (read_file(dir .. '/rc') or ''):match('%d') then break end
      os.execute('sleep 0.1')
    end
    assert.are.equal('0', (read_file(dir .. '/rc') or ''):match('%d+'))
  end)
end)
