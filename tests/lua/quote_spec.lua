-- quote_spec.lua: no string from a user or a file reaches a shell or
-- gnuplot unquoted (issue 38). fsdp.quote gives back every hostile string
-- exactly through sh and gnuplot; then each site that writes a command or
-- a script is run with a name holding `touch X`, $(touch X), quotes and a
-- semicolon, from a fresh directory (where a command that ran would leave
-- its marker): nothing runs, and the plot, chart or message is still made
-- from the real name. The sites (grep os.execute, io.popen, gnuplot):
-- fsdp.observe.plot (tools/plot.lua, the recipes' --plot), fsdp.sweep
-- (points, the chart, --out), fsdp.data.hub's printed download commands,
-- tools/kernel_resources.lua, tools/layers.lua; the REPL's help lists
-- files with lfs, the host name comes from gethostname, kill_self calls
-- kill(2), and the benchmarks run word lists: none of those has a shell
-- string left.
local files = require 'fsdp.io.files'
local quote = require 'fsdp.quote'
local sweep = require 'fsdp.sweep'
local plot = require 'fsdp.observe.plot'
local host = require 'fsdp.host'
local T = require 'fsdp.testing'
local lfs = require 'lfs'

local gnuplot = select(2, T.sh('command -v gnuplot')) == 0
local function need_gnuplot()
  if not gnuplot then pending('gnuplot not installed (Debian: gnuplot-nox; ./build.sh installs it)') end
  return gnuplot
end

-- A name with every way a shell or gnuplot could run something: each
-- would create its own marker in the working directory.
local HOSTILE = "r`touch BQ`$(touch DS)'q\";touch SC;\\"
local MARKERS = { 'BQ', 'DS', 'SC' }

local function no_markers(dir, out)
  for _, m in ipairs(MARKERS) do
    assert(files.mode(dir .. '/' .. m) == nil, ('marker %s was created in %s: a command ran\n%s'):format(m, dir,
      out or ''))
  end
end

-- A command run from `dir` (so markers land there), the executable and
-- scripts by absolute path; output and status.
local function sh_in(dir, cmd) return T.sh(('cd %s && %s'):format(T.quote(dir), cmd)) end
local function exe_in(dir, script, args, seconds)
  return sh_in(dir, ('timeout %d %s %s %s'):format(seconds or 60, T.quote(host.exe),
    T.quote(host.root .. '/' .. script), args))
end

-- fn() run with `dir` as the working directory (where the in-process
-- sites would leave markers).
local function in_dir(dir, fn)
  local here = lfs.currentdir()
  assert(lfs.chdir(dir))
  local ok, err = pcall(fn)
  assert(lfs.chdir(here))
  if not ok then error(err, 0) end
end

-- A gnuplot script as fsdp.quote writes them: no backtick (a command) or
-- @ (a macro) anywhere, and every backslash an octal escape of a string.
local function assert_safe_script(path)
  local text = assert(files.read(path))
  assert(not text:find('[`@]'), ('%s holds a backtick or an @:\n%s'):format(path, text))
  assert(not text:gsub('\\[0-7][0-7][0-7]', ''):find('\\', 1, true), ('%s holds a bare backslash:\n%s'):format(path,
    text))
  return text
end

local function write_metrics(path)
  local f = assert(io.open(path, 'w'))
  for s = 1, 4 do
    f:write(('{"type":"train","step":%d,"loss":%g,"lr":0.1,"tokens_per_sec":10,"peak_memory_bytes":1048576}\n')
      :format(s, 5 - s))
  end
  f:close()
end

describe('fsdp.quote', function()
  -- (the ones starting with quotes are what gnuplot 5.4 misreads as
  -- single-quoted strings with the quote doubled: '''' and '''a')
  local strings = { '', 'plain', 'two words', HOSTILE, "it's", "''", "'a", 'a\nb\r\n', '-n', 'X=1', '~', '*',
                    '$HOME', '!x', '\t', 'caf\195\169', '%d', 'a\\', '@x', '"\\140"' }

  it('gives every string back through sh exactly, running nothing', function()
    local dir = T.tmpdir()
    for _, s in ipairs(strings) do
      local out, rc = sh_in(dir, quote.command({ 'printf', '%s', s }))
      assert.equals(0, rc, out)
      assert.equals(s, out)
    end
    -- plain words stay readable; an assignment is quoted
    assert.equals('--max_steps=3', quote.shell('--max_steps=3'))
    assert.equals("'X=1'", quote.shell('X=1'))
    local out, rc = quote.capture({ 'sh', '-c', 'echo "$1"; exit 3', 'sh', HOSTILE })
    assert.equals(3, rc)
    assert.equals(HOSTILE .. '\n', out)
    no_markers(dir)
    no_markers(lfs.currentdir())
    files.remove_tree(dir)
  end)

  it('gives every string back through gnuplot exactly, line breaks included, running nothing', function()
    if not need_gnuplot() then return end
    local dir = T.tmpdir()
    local lines = { 'x = "BQ"' } -- @x would expand to BQ
    for _, s in ipairs(strings) do lines[#lines + 1] = ('print %s'):format(quote.gnuplot(s)) end
    local f = assert(io.open(dir .. '/p.gp', 'w'))
    f:write(table.concat(lines, '\n'), '\n')
    f:close()
    assert_safe_script(dir .. '/p.gp')
    local out, rc = sh_in(dir, 'gnuplot p.gp')
    assert.equals(0, rc, out)
    assert.equals(table.concat(strings, '\n') .. '\n', out)
    no_markers(dir, out)
    assert.equals('"plain-name_1.txt"', quote.gnuplot('plain-name_1.txt'))
    T.raises(function() quote.gnuplot('a\0b') end, '"a\\000b" holds a NUL byte, which a gnuplot string cannot hold')
    files.remove_tree(dir)
  end)
end)

describe('every site that writes a command or a script', function()
  it('tools/plot.lua: a JSONL named with commands is drawn, nothing runs', function()
    if not need_gnuplot() then return end
    local dir = T.tmpdir()
    local jsonl = dir .. '/' .. HOSTILE .. '.jsonl'
    write_metrics(jsonl)
    local out, rc = exe_in(dir, 'tools/plot.lua', ('%s --size=320x240 --title=%s'):format(T.quote(jsonl),
      T.quote('t`touch BQ`\n"x@')))
    assert.equals(0, rc, out)
    no_markers(dir, out)
    local base = dir .. '/' .. HOSTILE
    assert.same({ 320, 240 }, { plot.png_size(base .. '.png') })
    assert.truthy(files.read(base .. '.svg'):find('<svg', 1, true))
    local gp = assert_safe_script(base .. '.gp')
    -- the data file and the legend are the real names
    assert.truthy(gp:find(quote.gnuplot(base .. '.1.dat'), 1, true), gp)
    assert.truthy(gp:find('title ' .. quote.gnuplot(HOSTILE), 1, true), gp)
    files.remove_tree(dir)
  end)

  it('fsdp.observe.plot draws into a name with a line break, and refuses a NUL before writing anything', function()
    if not need_gnuplot() then return end
    local dir = T.tmpdir()
    write_metrics(dir .. '/m\n1.jsonl')
    local out
    in_dir(dir, function()
      out = plot.draw({ dir .. '/m\n1.jsonl' }, dir .. '/a\n`touch BQ`', { width = 200, height = 100 })
    end)
    no_markers(dir)
    assert.same({ 200, 100 }, { plot.png_size(out.png) })
    assert.equals(dir .. '/a\n`touch BQ`.png', out.png)
    assert_safe_script(out.gp)
    local before = files.list(dir)
    T.raises(function() plot.draw({ dir .. '/m\n1.jsonl' }, dir .. '/b\0') end, 'fsdp.plot: cannot plot into "' .. dir
      .. '/b\\000": ')
    assert.same(before, files.list(dir))
    files.remove_tree(dir)
  end)

  it('a recipe\'s --plot of a --metrics_file named with commands draws it, nothing runs', function()
    if not need_gnuplot() then return end
    local dir = T.tmpdir()
    local metrics = dir .. '/' .. HOSTILE .. '.jsonl'
    local args = ('--model=tiny --vocab_size=257 --seq_len=16 --batch_size=2 --max_steps=2 --warmup_steps=1 '
      .. '--metrics_file=%s --plot'):format(T.quote(metrics))
    local out, rc = exe_in(dir, 'recipes/llama2_7b.lua', args, 120)
    assert.equals(0, rc, out)
    no_markers(dir, out)
    assert.matches('plot: wrote ' .. dir .. '/' .. HOSTILE .. '.png', out, 1, true)
    assert.equals('\137PNG', files.read(dir .. '/' .. HOSTILE .. '.png'):sub(1, 4))
    assert_safe_script(dir .. '/' .. HOSTILE .. '.gp')
    files.remove_tree(dir)
  end)

  it('recipes/sweep.lua: --out, --recipe and --args holding commands run nothing; the chart is drawn', function()
    if not need_gnuplot() then return end
    local dir = T.tmpdir()
    local recipe = dir .. '/' .. HOSTILE .. '.lua'
    local f = assert(io.open(recipe, 'w'))
    f:write([[
local cfg = require('fsdp.options').config({ a = { '', 'any text' }, max_steps = { 1, 'steps', int = true },
  warmup_steps = { 0, 'warmup' }, log_every = { 1, 'log' }, summary = { false, 'summary' },
  skip_fit_check = { false, 'no fit check' } }, arg, 'r.lua')
assert(cfg.a == "`id>BQ`$(id>DS);id>SC;'\"" or cfg.a:match('^[xy]'), 'the argument arrived changed: ' .. cfg.a)
print('SUMMARY {"samples_per_s": 2, "tflops": 0, "peak_bytes": 1048576}')
]])
    f:close()
    local out_dir = dir .. '/' .. HOSTILE
    -- (--grid and --args are split at blanks: commands without them)
    local out, rc = exe_in(dir, 'recipes/sweep.lua', ('--recipe=%s --grid=%s --args=%s --steps=1 --out=%s'):format(
      T.quote(recipe), T.quote("a=x`id>BQ`,y$(id>DS)"), T.quote("--a=`id>BQ`$(id>DS);id>SC;'\""),
      T.quote(out_dir)))
    assert.equals(0, rc, out)
    no_markers(dir, out)
    assert.matches('\n1%s+x`id>BQ`%s+ok', out)
    assert.matches('wrote ' .. out_dir .. '/sweep.png', out, 1, true)
    assert.equals('\137PNG', files.read(out_dir .. '/sweep.png'):sub(1, 4))
    local gp = assert_safe_script(out_dir .. '/sweep.gp')
    assert.truthy(gp:find('title ' .. quote.gnuplot(recipe .. " --a=`id>BQ`$(id>DS);id>SC;'\""), 1, true), gp)
    assert.truthy(files.read(out_dir .. '/sweep.csv'):find('\nx`id>BQ`,ok,', 1, true))
    files.remove_tree(dir)
  end)

  it('fsdp.sweep.write_chart: labels with quotes and line breaks stay in their field', function()
    if not need_gnuplot() then return end
    local dir = T.tmpdir()
    local axes = { { name = 'a', values = {} } }
    local results = { { point = { a = 'p"\n`touch BQ`' }, status = 'ok', samples_per_s = 3, peak_bytes = 2 ^ 20 },
                      { point = { a = "q'$(touch DS)" }, status = 'oom', message = 'out of memory' } }
    local ok, why
    in_dir(dir, function()
      ok, why = sweep.write_chart(dir .. '/c.png', axes, results, { title = 'T\n`touch SC`', limit_mb = 2 })
    end)
    assert.is_true(ok, why)
    no_markers(dir)
    assert_safe_script(dir .. '/c.gp')
    local rows = {}
    for line in io.lines(dir .. '/c.dat') do if not line:match('^#') then rows[#rows + 1] = line end end
    assert.same({ "1 \"p''`touch BQ`\" 3 1.0 \"\"", "2 \"q'$(touch DS)\" 0 0 \"OOM\"" }, rows)
    in_dir(dir, function() ok, why = sweep.write_chart(dir .. '/x\n`touch BQ`.png', axes, results) end)
    assert.is_true(ok, why)
    assert.equals('\137PNG', files.read(dir .. '/x\n`touch BQ`.png'):sub(1, 4))
    no_markers(dir)
    files.remove_tree(dir)
  end)

  it('fsdp.data.hub: the download commands it prints quote the names', function()
    local dir = T.tmpdir()
    local name = "o/`touch BQ`$(touch DS);touch SC;'"
    local ok, err = pcall(require('fsdp.data.hub').tokenizer_dir, name)
    assert.is_false(ok)
    local cmd = err:match('\n  (huggingface%-cli download [^\n]+)')
    assert.is_string(cmd, err)
    -- the printed line, run with a stand-in for huggingface-cli, passes the name as one word
    local out, rc = sh_in(dir, "huggingface_cli() { printf '%s\\n' \"$@\"; }; " .. cmd:gsub('^huggingface%-cli',
      'huggingface_cli'))
    assert.equals(0, rc, out)
    assert.equals(table.concat({ 'download', name, 'tokenizer.model', 'tokenizer.json', 'tokenizer_config.json' },
      '\n') .. '\n', out)
    no_markers(dir, out)
    files.remove_tree(dir)
  end)

  it('tools/kernel_resources.lua and tools/layers.lua take a directory holding commands as a name', function()
    local dir = T.tmpdir()
    local odd = dir .. '/' .. HOSTILE
    assert(lfs.mkdir(odd))
    -- a ptxas report of one kernel: read from the odd directory, its name demangled by c++filt
    local f = assert(io.open(odd .. '/k.o.ptxas', 'w'))
    f:write("ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90'\n",
            'ptxas info    : Function properties for _Z3fooPf\n',
            '    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n',
            'ptxas info    : Used 10 registers, 0 bytes smem, 0 bytes cmem[0]\n')
    f:close()
    local out, rc = exe_in(dir, 'tools/kernel_resources.lua', '--dir=' .. T.quote(odd))
    assert.equals(0, rc, out)
    assert.matches('foo(float*)', out, 1, true)
    no_markers(dir, out)
    out, rc = sh_in(dir, ('cd %s && luajit tools/layers.lua %s'):format(T.quote(host.root), T.quote(odd)))
    assert.equals(2, rc, out)
    assert.matches('no objects in ' .. odd, out, 1, true)
    no_markers(dir, out)
    no_markers(lfs.currentdir(), out)
    files.remove_tree(dir)
  end)
end)
