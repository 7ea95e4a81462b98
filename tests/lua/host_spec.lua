-- host_spec.lua: the fsdp-lua executable, from the outside.
--
-- Runs inside fsdp-lua (busted under the host), finds the binary through
-- require('fsdp.host').exe and starts it as a child process: command line,
-- exit codes, the `arg` table, error reports, finding the project root, and
-- the REPL both on piped input and on a real terminal (driven with tmux).
-- Every child runs under `timeout` so a hung REPL fails the test instead of
-- the suite.

local host = require 'fsdp.host'
local EXE = host.exe

local function quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Run a shell command line; returns its output and exit code. `streams`
-- picks the output: 'both' (default), 'stdout' or 'stderr'.
local function sh(cmd, streams)
  local redirect = ({
    both = '2>&1',
    stdout = '2>/dev/null',
    stderr = '2>&1 >/dev/null',
  })[streams or 'both']
  local f = assert(io.popen(('(%s) %s; echo "@rc=$?"'):format(cmd, redirect)))
  local out = f:read('*a')
  f:close()
  local body, rc = out:match('^(.-)@rc=(%d+)\n?$')
  assert(body, 'could not parse the output of: ' .. cmd .. '\n' .. out)
  return body, tonumber(rc)
end

-- The executable with arguments (each quoted), bounded in time.
local function fl(...)
  -- --foreground: without it, timeout relays a signal it receives to its
  -- whole process group too, so the host would get SIGINT twice.
  local parts = { 'timeout --foreground 10', quote(EXE) }
  for i = 1, select('#', ...) do parts[#parts + 1] = quote((select(i, ...))) end
  return table.concat(parts, ' ')
end

local function contains(haystack, needle)
  assert.is_truthy(haystack:find(needle, 1, true),
    ('expected to find %q in:\n%s'):format(needle, haystack))
end

local function not_contains(haystack, needle)
  assert.is_falsy(haystack:find(needle, 1, true),
    ('did not expect %q in:\n%s'):format(needle, haystack))
end

local read_file = require('fsdp.io.files').read

local function write_file(path, text)
  local f = assert(io.open(path, 'wb'))
  f:write(text)
  f:close()
end

local function make_temp_dir()
  local out, rc = sh('mktemp -d')
  assert.are.equal(0, rc, out)
  -- Canonical, so it compares with the host's realpath'd root.
  local dir = out:gsub('%s+$', '')
  return (sh('cd ' .. quote(dir) .. ' && pwd -P', 'stdout'):gsub('%s+$', ''))
end

local tmp

setup(function()
  assert.is_string(EXE)
  tmp = make_temp_dir()
end)

teardown(function()
  if tmp then os.execute('rm -rf ' .. quote(tmp)) end
end)

describe('fsdp.host', function()
  it('describes the executable and the project', function()
    assert.are.equal('/', EXE:sub(1, 1))
    assert.is_string(host.root)
    assert.are.equal('/', host.root:sub(1, 1))
    assert.is_truthy(read_file(host.root .. '/lua/fsdp/repl/init.lua'))
    assert.is_string(host.version)
    assert.is_string(host.build_info)
    assert.is_boolean(host.cuda_built)
    assert.is_false(host.interactive)
    for _, name in ipairs { 'readline', 'add_history', 'history_file', 'isatty' } do
      assert.is_function(host[name], name)
    end
  end)

  it('says whether the REPL will run', function()
    local out = sh(fl('-e', 'print(require("fsdp.host").interactive)'))
    assert.are.equal('false\n', out)
    out = sh('echo | ' .. fl('-i', '-e', 'print(require("fsdp.host").interactive)'))
    assert.are.equal('true\n', out)
  end)

  it('reads lines from piped input with readline, nil at the end', function()
    local code = 'local h = require("fsdp.host") print(h.readline("> ")) print(h.readline("> "))'
    local out, rc = sh("printf 'hello world\\n' | " .. fl('-e', code))
    assert.are.equal(0, rc, out)
    assert.are.equal('hello world\nnil\n', out)  -- no prompt when not a terminal
  end)

  it('answers isatty for file descriptors', function()
    local out = sh(fl('-e', 'print(require("fsdp.host").isatty(0))') .. ' < /dev/null')
    assert.are.equal('false\n', out)
  end)

  it('keeps the history file under HOME, none without HOME', function()
    local code = 'print(require("fsdp.host").history_file())'
    local out = sh('HOME=/some/home ' .. fl('-e', code))
    assert.are.equal('/some/home/.fsdp_lua_history\n', out)
    out = sh('env -u HOME ' .. fl('-e', code))
    assert.are.equal('nil\n', out)
  end)
end)

describe('command line', function()
  it('--version prints the version, build, LuaJIT and the CPU level', function()
    for _, flag in ipairs { '--version', '-v' } do
      local out, rc = sh(fl(flag))
      assert.are.equal(0, rc, out)
      local first, second, third = out:match('^([^\n]*)\n([^\n]*)\n([^\n]*)\n$')
      assert.are.equal('fsdp-lua ' .. host.version, first)
      contains(second, host.build_info)
      contains(second, 'LuaJIT')
      assert.are.equal('cpu: ' .. require('fsdp').cpu_isa().text, third)
    end
  end)

  it('--help lists options and environment variables', function()
    for _, flag in ipairs { '--help', '-h' } do
      local out, rc = sh(fl(flag))
      assert.are.equal(0, rc, out)
      for _, word in ipairs { 'usage: fsdp-lua', '-e CODE', '-i', '--version',
                              '--help', 'FSDP_LUA_HOME', 'OMP_NUM_THREADS',
                              'OPENBLAS_NUM_THREADS' } do
        contains(out, word)
      end
    end
  end)

  it('-e runs code in order, both spellings', function()
    local out, rc = sh(fl('-e', 'x = 20', '-ex = x * 2', '-e', 'print(x + 2)'))
    assert.are.equal(0, rc, out)
    assert.are.equal('42\n', out)
  end)

  it('rejects an unknown option with exit 2 and a hint', function()
    local out, rc = sh(fl('--frobnicate'), 'stderr')
    assert.are.equal(2, rc)
    contains(out, "'--frobnicate'")
    contains(out, '--help')
    out, rc = sh(fl('-e'), 'stderr')
    assert.are.equal(2, rc)
    contains(out, "'-e'")
  end)

  it('gives a script `arg` and `...` as lua does', function()
    local script = tmp .. '/args.lua'
    write_file(script, [[
print(select('#', ...), ...)
print(arg[0], arg[1], arg[2], arg[3], arg[-1], arg[-2], arg[-3] == ]] ..
      ('%q'):format(EXE) .. [[)
print(#arg)
]])
    local out, rc = sh(fl('-e', 'y = 1', script, 'a', '-i', 'c d'))
    assert.are.equal(0, rc, out)
    assert.are.equal(
      '3\ta\t-i\tc d\n' ..
      script .. '\ta\t-i\tc d\ty = 1\t-e\ttrue\n' ..
      '3\n', out)
  end)

  it('treats the argument after -- as the script', function()
    local script = tmp .. '/dash.lua'
    write_file(script, 'print(arg[0], arg[-1], ...)\n')
    local out, rc = sh(fl('--', script, '-x'))
    assert.are.equal(0, rc, out)
    assert.are.equal(script .. '\t--\t-x\n', out)
  end)

  it('runs standard input for - and for piped input without a script', function()
    local out, rc = sh("printf 'print(\"stdin\", ...)\\n' | " .. fl('-', 'a', 'b'))
    assert.are.equal(0, rc, out)
    assert.are.equal('stdin\ta\tb\n', out)
    out, rc = sh("printf 'print(6 * 7)\\n' | " .. fl())
    assert.are.equal(0, rc, out)
    assert.are.equal('42\n', out)
  end)

  it('exits with os.exit status', function()
    local _, rc = sh(fl('-e', 'os.exit(3)'))
    assert.are.equal(3, rc)
    _, rc = sh(fl('-e', 'os.exit(true)'))
    assert.are.equal(0, rc)
  end)
end)

describe('errors', function()
  it('print the message and a traceback on stderr and exit 1', function()
    local script = tmp .. '/boom.lua'
    write_file(script, 'local function inner() error("boom") end\nprint("before")\ninner()\n')
    local err, rc = sh(fl(script), 'stderr')
    assert.are.equal(1, rc)
    contains(err, 'fsdp-lua: ' .. script .. ':1: boom')
    contains(err, 'stack traceback:')
    contains(err, script .. ':3:')
    local out = sh(fl(script), 'stdout')
    assert.are.equal('before\n', out)
  end)

  it('in -e code and piped stdin exit 1 too', function()
    local err, rc = sh(fl('-e', 'error("from e")'), 'stderr')
    assert.are.equal(1, rc)
    contains(err, 'fsdp-lua: (command line):1: from e')
    err, rc = sh("printf 'local x = nil\\nreturn x.field\\n' | " .. fl(), 'stderr')
    assert.are.equal(1, rc)
    contains(err, 'stdin:2:')
    contains(err, 'stack traceback:')
  end)

  it('stop at the first failing chunk', function()
    local out, rc = sh(fl('-e', 'error("first")', '-e', 'print("second")'))
    assert.are.equal(1, rc)
    not_contains(out, 'second')
  end)

  it('with a nil error object (busted on failures) exit 1', function()
    local err, rc = sh(fl('-e', 'error(nil)'), 'stderr')
    assert.are.equal(1, rc)
    contains(err, 'fsdp-lua: (error object is a nil value)')
  end)

  it('with a table error object use its __tostring', function()
    local code = 'error(setmetatable({}, {__tostring = function() return "custom" end}))'
    local err, rc = sh(fl('-e', code), 'stderr')
    assert.are.equal(1, rc)
    contains(err, 'fsdp-lua: custom')
    err, rc = sh(fl('-e', 'error({})'), 'stderr')
    assert.are.equal(1, rc)
    contains(err, '(error object is a table value)')
  end)

  it('for a missing script and a syntax error exit 1', function()
    local err, rc = sh(fl(tmp .. '/missing.lua'), 'stderr')
    assert.are.equal(1, rc)
    contains(err, 'missing.lua')
    err, rc = sh(fl('-e', 'x = = 1'), 'stderr')
    assert.are.equal(1, rc)
    contains(err, "unexpected symbol near '='")
  end)

  it('Ctrl-C (SIGINT) interrupts a running chunk with an error', function()
    -- Signal only once the chunk runs (jit.off: compiled loops run no hooks).
    local log = tmp .. '/sigint.log'
    local code = 'io.write("started\\n") io.flush() jit.off() while true do end'
    local cmd = ('%s > %s 2>&1 & pid=$!\n' ..
                 'for i in $(seq 100); do grep -q started %s && break; sleep 0.1; done\n' ..
                 'kill -INT $pid; wait $pid; rc=$?; cat %s; exit $rc'):format(
                 fl('-e', code), quote(log), quote(log), quote(log))
    local out, rc = sh(cmd)
    assert.are.equal(1, rc, out)
    contains(out, 'started')
    contains(out, 'interrupted!')
  end)
end)

describe('project root', function()
  it('is found from another directory', function()
    local code = 'require "fsdp.repl" print(require("fsdp.host").root)'
    local out, rc = sh('cd / && ' .. fl('-e', code))
    assert.are.equal(0, rc, out)
    assert.are.equal(host.root .. '\n', out)
  end)

  it('puts lua/ and the root first on package.path and keeps the default', function()
    local out, rc = sh('cd / && ' .. fl('-e', 'print(package.path)'))
    assert.are.equal(0, rc, out)
    local root = host.root
    local prefix = root .. '/lua/?.lua;' .. root .. '/lua/?/init.lua;' ..
                   root .. '/?.lua;' .. root .. '/?/init.lua;'
    assert.are.equal(prefix, out:sub(1, #prefix))
    -- Debian's Lua modules (busted's own) still load.
    out, rc = sh('cd / && ' .. fl('-e', 'require "luassert" print("ok")'))
    assert.are.equal(0, rc, out)
    assert.are.equal('ok\n', out)
  end)

  it('honours FSDP_LUA_HOME', function()
    local root = tmp .. '/home'
    os.execute('mkdir -p ' .. quote(root .. '/lua/fsdp') .. ' ' .. quote(root .. '/models'))
    write_file(root .. '/lua/fsdp/probe.lua', 'return "probe from home"\n')
    write_file(root .. '/models/tiny.lua', 'return "tiny model"\n')
    local code = 'print(require("fsdp.host").root, require("fsdp.probe"), require("models.tiny"))'
    local out, rc = sh('cd / && FSDP_LUA_HOME=' .. quote(root) .. ' ' .. fl('-e', code))
    assert.are.equal(0, rc, out)
    assert.are.equal(root .. '\tprobe from home\ttiny model\n', out)
  end)

  -- A copy of the executable elsewhere; it finds libfsdp.so through
  -- LD_LIBRARY_PATH instead of its rpath ($ORIGIN/../lib).
  local function copy_exe(bin_dir)
    os.execute('mkdir -p ' .. quote(bin_dir) .. ' && cp ' .. quote(EXE) .. ' ' .. quote(bin_dir))
    local lib_dir = EXE:match('^(.*)/[^/]+/[^/]+$') .. '/lib'
    return 'LD_LIBRARY_PATH=' .. quote(lib_dir) .. ' timeout --foreground 10 ' .. quote(bin_dir .. '/fsdp-lua')
  end

  it('is found in the installed layout <prefix>/share/fsdp-lua', function()
    local prefix = tmp .. '/prefix'
    local exe = copy_exe(prefix .. '/bin')
    os.execute('mkdir -p ' .. quote(prefix .. '/share') .. ' && ln -s ' ..
               quote(host.root) .. ' ' .. quote(prefix .. '/share/fsdp-lua'))
    local out, rc = sh('cd / && ' .. exe .. " -e 'print(require(\"fsdp.host\").root)'")
    assert.are.equal(0, rc, out)
    assert.are.equal(host.root .. '\n', out)
  end)

  it('may be missing: root is nil and the built-in REPL still works', function()
    local exe = copy_exe(tmp .. '/lonely/bin')
    local out, rc = sh('cd / && ' .. exe .. " -e 'print(require(\"fsdp.host\").root)'")
    assert.are.equal(0, rc, out)
    assert.are.equal('nil\n', out)
    out, rc = sh("cd / && printf 'print(6 * 7)\\n' | " .. exe)
    assert.are.equal(0, rc, out)
    assert.are.equal('42\n', out)
    out, rc = sh("cd / && printf '6 * 7\\n' | " .. exe .. ' -i')
    assert.are.equal(0, rc, out)
    contains(out, 'built-in REPL')
    contains(out, '42\n')
  end)

  it('rejects an FSDP_LUA_HOME without lua/fsdp, naming it', function()
    local bad = tmp .. '/not-a-root'
    os.execute('mkdir -p ' .. quote(bad))
    local err, rc = sh('FSDP_LUA_HOME=' .. quote(bad) .. ' ' .. fl('-e', 'print("ran")'))
    assert.are_not.equal(0, rc)
    contains(err, 'FSDP_LUA_HOME')
    contains(err, bad)
    not_contains(err, 'ran')
  end)
end)

describe('REPL on piped input', function()
  it('runs after a script with -i: values, multi-line input, no prompts', function()
    local script = tmp .. '/setup.lua'
    write_file(script, 'y = 41\n')
    local input = 'y + 1\\nfor i = 1, 2 do\\nprint("i=" .. i)\\nend\\n"a", nil, 3\\n'
    local out, rc = sh("printf '" .. input .. "' | " .. fl('-i', script))
    assert.are.equal(0, rc, out)
    assert.are.equal('42\ni=1\ni=2\na\tnil\t3\n', out)
  end)

  it('prints errors with their traceback and goes on', function()
    local input = 'error("boom")\\n)\\nlocal t = nil; return t.x\\nprint("after")\\n'
    local out, rc = sh("printf '" .. input .. "' | " .. fl('-i'))
    assert.are.equal(0, rc, out)
    contains(out, 'stdin:1: boom')
    contains(out, "stdin:1: unexpected symbol near ')'")
    contains(out, 'stack traceback:')
    contains(out, 'stdin:1: in main chunk')
    not_contains(out, 'repl.lua')  -- the REPL's own frames are trimmed
    contains(out, 'after\n')
  end)

  it("prints a library's verdict on the typed call as one line, without a traceback", function()
    local out, rc = sh("printf 'fsdp.plan(1)\\nprint(\"after\")\\n' | " .. fl('-i'))
    assert.are.equal(0, rc, out)
    contains(out, 'stdin:1: fsdp.plan: expected an nn.Module (built on meta), got number\n')
    not_contains(out, 'stack traceback:')
    contains(out, 'after\n')
  end)

  it('works with the built-in REPL when fsdp.repl cannot load', function()
    local root = tmp .. '/bare'
    os.execute('mkdir -p ' .. quote(root .. '/lua/fsdp'))
    local cmd = "printf '1 + 1\\nfor i = 1, 2 do\\nprint(i)\\nend\\n' | FSDP_LUA_HOME=" ..
                quote(root) .. ' ' .. fl('-i')
    local out, rc = sh(cmd)
    assert.are.equal(0, rc, out)
    contains(out, 'built-in REPL')
    contains(out, '2\n1\n2\n')
  end)
end)

describe('fsdp.repl', function()
  local repl = require 'fsdp.repl'

  local capture = require('fsdp.testing').capture_stdout

  it('compiles expressions, statements and knows incomplete input', function()
    assert.are.equal(3, repl.compile('1 + 2')())
    assert.is_function(repl.compile('local z = 1'))
    local fn, err, incomplete = repl.compile('for i = 1, 2 do')
    assert.is_nil(fn)
    assert.is_string(err)
    assert.is_true(incomplete)
    fn, err, incomplete = repl.compile('{1,')
    assert.is_nil(fn)
    assert.is_true(incomplete)
    fn, err, incomplete = repl.compile(')')
    assert.is_nil(fn)
    assert.is_false(incomplete)
    assert.are.equal(7, repl.compile('=7')())
  end)

  it('prints values through the printers hook, tab-separated', function()
    local marker = {}
    table.insert(repl.printers, function(v) if v == marker then return '<marker>' end end)
    local out = capture(function() repl.print_value(1, nil, 'x', marker) end)
    table.remove(repl.printers)
    assert.are.equal('1\tnil\tx\t<marker>\n', out)
  end)

  it('survives a failing __tostring', function()
    local bad = setmetatable({}, { __tostring = function() error('no') end })
    local text = repl.format_value(bad)
    contains(text, 'tostring failed')
  end)
end)

-- The REPL on a real terminal, typed into a tmux pane.
describe('REPL on a terminal', function()
  local have_tmux = select(2, sh('command -v tmux')) == 0
  local socket, home, rc_file

  local function tmux(args)
    return sh('env -u TMUX tmux -S ' .. quote(socket) .. ' -f /dev/null ' .. args)
  end

  local function screen()
    return (tmux('capture-pane -p -t repl'))
  end

  -- Poll the pane until it shows `text` (at most 10 s). The pane's lines
  -- come without trailing blanks: a prompt waiting for input is "\n>".
  local function wait_for(text)
    for _ = 1, 100 do
      local s = screen()
      if s:find(text, 1, true) then return s end
      os.execute('sleep 0.1')
    end
    error(('timed out waiting for %q on the terminal:\n%s'):format(text, screen()))
  end

  local function type_line(line)
    tmux('send-keys -t repl -l ' .. quote(line))  -- -l: literal, "end" is no key name
    tmux('send-keys -t repl Enter')
  end

  local function wait_exit()
    for _ = 1, 100 do
      local rc = read_file(rc_file)
      if rc and rc:match('%d') then return tonumber(rc:match('%d+')) end
      os.execute('sleep 0.1')
    end
    error('the REPL did not exit within 10 s')
  end

  -- Wait until the last line is an empty prompt: keys typed while a chunk
  -- still runs reach the terminal before the line editor, so Tab must wait.
  local function wait_prompt()
    for _ = 1, 150 do
      local s = screen():gsub('%s+$', '')
      if s:sub(-2) == '\n>' or s == '>' then return end
      os.execute('sleep 0.1')
    end
    error('timed out waiting for an empty prompt:\n' .. screen())
  end

  -- The whole pane, scrolled-off lines included.
  local function history()
    return (tmux('capture-pane -p -S - -t repl'))
  end

  local function wait_in_history(text)
    for _ = 1, 150 do
      local s = history()
      if s:find(text, 1, true) then return s end
      os.execute('sleep 0.1')
    end
    error(('timed out waiting for %q on the terminal:\n%s'):format(text, history()))
  end

  -- Start the executable with `args` (a shell-quoted string) in the pane,
  -- each time on a new private server (removed with tmp): a server just
  -- killed may still be exiting.
  local servers = 0
  local function start(args)
    home = tmp .. '/term-home'
    os.execute('rm -rf ' .. quote(home) .. ' && mkdir -p ' .. quote(home))
    servers = servers + 1
    socket = ('%s/tmux%d.sock'):format(tmp, servers)
    rc_file = home .. '/rc'
    local cmd = ('env HOME=%s LANG=C.UTF-8 %s %s; echo $? > %s'):format(
      quote(home), quote(EXE), args, quote(rc_file))
    local out, rc = tmux('new-session -d -x 120 -y 40 -s repl ' .. quote(cmd))
    assert.are.equal(0, rc, out)
  end

  before_each(function()
    if have_tmux then start('') end
  end)

  after_each(function()
    if have_tmux then tmux('kill-server') end
  end)

  it('evaluates expressions and multi-line input, Ctrl-D exits 0', function()
    if not have_tmux then pending('tmux is not installed: terminal REPL not tested') return end
    wait_for('Ctrl-D exits')
    wait_for('\n>')
    type_line('x = 40 + 2')
    type_line('x')
    wait_for('\n42')
    type_line('for i = 1, 2 do')
    wait_for('\n>>')
    type_line('print("line " .. i)')
    type_line('end')
    wait_for('line 2')
    type_line('s = "héllo"')
    type_line('s .. "|" .. #s')  -- UTF-8 typed in arrives as UTF-8
    wait_for('héllo|6')
    tmux('send-keys -t repl C-d')
    assert.are.equal(0, wait_exit())
    local history = read_file(home .. '/.fsdp_lua_history')
    assert.is_string(history, 'no history file written')
    contains(history, '\nx\n')
  end)

  it('keeps going after errors; Ctrl-C cancels a line and interrupts a chunk', function()
    if not have_tmux then pending('tmux is not installed: terminal REPL not tested') return end
    wait_for('\n>')
    type_line('error("oops")')
    wait_for('stdin:1: oops')
    tmux('send-keys -t repl -l ' .. quote('print("DROP" .. "PED")'))
    tmux('send-keys -t repl C-c')
    -- Ctrl-C once the loop runs (jit.off: compiled loops run no hooks).
    type_line('print("loop" .. "ing") jit.off() while true do end')
    wait_for('\nlooping')
    tmux('send-keys -t repl C-c')
    wait_for('interrupted!')
    type_line('print("still " .. "alive")')
    wait_for('still alive')
    not_contains(screen(), 'DROPPED')  -- the cancelled line never ran
    tmux('send-keys -t repl C-d')
    assert.are.equal(0, wait_exit())
  end)

  it('completes names with Tab: fields, methods, numbered layers', function()
    if not have_tmux then pending('tmux is not installed: terminal REPL not tested') return end
    wait_prompt()
    tmux('send-keys -t repl -l fsdp.man')
    tmux('send-keys -t repl Tab')
    wait_for('> fsdp.manual_seed')
    tmux('send-keys -t repl C-c')
    -- Several choices: Tab completes the common part, Tab Tab lists them.
    tmux('send-keys -t repl -l fsdp.ra')
    tmux('send-keys -t repl Tab')
    wait_for('> fsdp.rand')
    tmux('send-keys -t repl Tab')
    local s = wait_for('fsdp.randint')
    assert.is_truthy(s:find('fsdp.randn', 1, true), s)
    tmux('send-keys -t repl C-c')
    wait_prompt()
    type_line('x = fsdp.zeros(2, 3)')
    wait_prompt()
    tmux('send-keys -t repl -l x:resh')
    tmux('send-keys -t repl Tab')
    tmux('send-keys -t repl -l "(3, 2).shape"')
    tmux('send-keys -t repl Enter')
    wait_for('x:reshape(3, 2).shape')
    wait_for('{3, 2}')  -- printed by the table printer
    wait_prompt()
    type_line("m = require('models.llama').build('tiny', {device = 'meta'})")
    wait_prompt()
    -- Numbered layers by their names in brackets ([Note: module names and
    -- Lua paths]); a name typed as printed is respelled so that it parses.
    tmux('send-keys -t repl -l m.model.layers.1.ml')
    tmux('send-keys -t repl Tab')
    tmux('send-keys -t repl -l .up_pr')
    tmux('send-keys -t repl Tab')
    wait_for('> m.model.layers["1"].mlp.up_proj')
    tmux('send-keys -t repl C-c')
    -- Tab Tab lists methods and ["0"], ["1"], and keeps the typed '.'.
    tmux('send-keys -t repl -l m.model.layers.')
    tmux('send-keys -t repl Tab')
    tmux('send-keys -t repl Tab')
    s = wait_for('m.model.layers["1"]')
    assert.is_truthy(s:find('m.model.layers.append', 1, true), s)
    for _ = 1, 50 do  -- the prompt is redrawn under the list
      if s:find('\n> m%.model%.layers%.%s*$') then break end
      os.execute('sleep 0.1')
      s = screen()
    end
    assert.is_truthy(s:find('\n> m%.model%.layers%.%s*$'), s)
    tmux('send-keys -t repl C-c')
    type_line('print("done" .. "!")')
    wait_for('done!')
    tmux('send-keys -t repl C-d')
    assert.are.equal(0, wait_exit())
  end)

  it('builds Llama-2-70b on meta, prints and summarises it in seconds', function()
    if not have_tmux then pending('tmux is not installed: terminal REPL not tested') return end
    wait_for('\n>')
    type_line("t0 = require('fsdp.clock').now()")
    type_line("m = require('models.llama').build('llama2_70b', {device = 'meta'})")
    type_line('m')
    type_line('s = fsdp.summary(m)')
    type_line("print(('ELAP' .. 'SED %.3f s'):format(require('fsdp.clock').now() - t0))")
    local text = wait_in_history('ELAPSED ')
    local seconds = tonumber(text:match('ELAPSED ([%d.]+) s'))
    print(('# REPL: Llama-2-70b built on meta, printed and summarised in %.3f s'):format(seconds))
    assert.is_truthy(text:find('(0-79): 80 x LlamaDecoderLayer(', 1, true), text)
    assert.is_truthy(text:find('model.layers.0-79', 1, true), text)
    assert.is_truthy(text:find('total: 68,976,648,192 parameters, 257.0 GiB', 1, true), text)
    -- The bound only where the build is not slowed down by sanitizers.
    if not host.build_info:find('asan', 1, true) then assert.is_true(seconds < 5, text) end
    tmux('send-keys -t repl C-d')
    assert.are.equal(0, wait_exit())
  end)

  it('-i recipe --dry-run drops into the REPL with the recipe\'s model', function()
    if not have_tmux then pending('tmux is not installed: terminal REPL not tested') return end
    tmux('kill-server')
    start('-i ' .. quote(host.root .. '/recipes/llama2_7b.lua') .. ' --dry-run')
    wait_in_history('parameters: 6,738,415,616')
    wait_for('\n>')
    type_line('model:num_parameters()')
    wait_for('\n6738415616')
    type_line('cfg.dry_run, config.n_layers')
    wait_for('\ntrue')  -- the terminal shows the tab as blanks
    wait_prompt()
    tmux('send-keys -t repl -l model.lm_h')
    tmux('send-keys -t repl Tab')
    tmux('send-keys -t repl -l .weight.shape')
    tmux('send-keys -t repl Enter')
    wait_for('{32000, 4096}')
    type_line('help()')
    wait_in_history('from the recipe: cfg, config, model')
    tmux('send-keys -t repl C-d')
    assert.are.equal(0, wait_exit())
  end)
end)

describe('OpenMP wait policy', function()
  it('is passive with a short spin unless the user set one', function()
    local show = 'io.write(os.getenv("OMP_WAIT_POLICY"), " ", tostring(os.getenv("GOMP_SPINCOUNT")))'
    assert.are.equal('passive 5000', sh('env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY ' .. fl('-e', show)))
    assert.are.equal('passive 100', sh('env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=100 ' .. fl('-e', show)))
    assert.are.equal('active nil', sh('env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=active ' .. fl('-e', show)))
  end)
end)
