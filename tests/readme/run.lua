-- tests/readme/run.lua: the docs run as written. Every ```sh command and
-- every ```lua snippet of README.md and of each guide in docs/ (every
-- docs/*.md) is run, file by file, in order, and reported as TAP (the
-- `readme` suite of tests/run.sh), with the counts of run and skipped
-- blocks per file at the end:
--
--   build/bin/fsdp-lua tests/readme/run.lua [FILE.md ...]   (default: README.md, docs/*.md)
--   FSDP_README_ONLY=[FILE:]LINE,...  only the blocks holding these lines (of FILE,
--                              e.g. docs/gpu.md:40; a bare LINE: of every file run;
--                              a continued snippet still gets what it continues)
--
-- [Note: README test conventions]
-- What README.md and the guides may rely on, and what they must mark
-- (each file is read alone, as by a reader who opened just that file):
--   * ```sh (or bash, shell) blocks are commands: one per line, `\` at a
--     line's end continues it, `#` starts a comment. Each command runs in
--     its own bash from a scratch directory that mirrors the repository
--     (its top-level entries linked), so relative paths (recipes/...,
--     tests/golden/...) work and outputs (data/, checkpoints/, /tmp/...)
--     do not land in the tree. `fsdp-lua` is on PATH (README says so in
--     its quick start); an `export ...` command stays in effect for every
--     later command of the same file, as in the terminal of a reader
--     going top-down. Each file gets a fresh scratch directory and no
--     exports: a guide that needs one (Open MPI as root) says so itself.
--   * A command whose comment starts with `fsdp-lua:` shows the error it
--     gives: it must exit non-zero and print that comment's first line
--     (`...` in it stands for any text).
--   * ```lua blocks run in `fsdp-lua` as a script, where reading a global
--     that is not defined is an error (a snippet must define what it
--     uses, or continue the block that does). A block of REPL input
--     (`> ` lines, `>> ` continuing one; other lines are its output, not
--     checked) runs input by input as the REPL does, expressions printed.
--   * `<!-- readme-test: skip (why) -->` on the line before a block (blank
--     lines between allowed) skips the block, reported `ok N # SKIP why`;
--     `<!-- readme-test: continues -->` runs a lua block after the lua
--     block before it, in the same script (it continues its variables).
--     Any other `readme-test:` comment is an error (a typo must not
--     silently run or skip a block).
--   * Blocks in any other language, or none, are text and are not run.
--   * Paths under /tmp/ and /var/tmp/ (--checkpoint_dir=/tmp/ft/ckpt,
--     '/tmp/adapter') are the run's own: they run as the same paths
--     under the scratch directory (reported as written), so two runs at
--     once, or what an earlier run left in /tmp/ft, never meet.
--   * Relative links ([GPU](gpu.md#gpu-benchmark), ../README.md#quick-start)
--     must name a file that exists and, for a .md file, one of its
--     headings (GitHub's anchors): checked per file as one test.
-- Commands that cannot run in CI are in SKIP below, each with its reason;
-- long ones are shortened by SIZES below, only by appending options the
-- README documents. Nothing else is special-cased: a new block is run.
-- The repository: the tree this fsdp-lua runs its library from.
local root = require('fsdp.host').root

-- Commands not run, matched (Lua patterns) against the command's text.
local SKIP = {
  { '^%./build%.sh test', 'runs every suite, this one included (CI runs it)' },
  { '^%./build%.sh', 'installs packages with apt-get and builds: done before the suite runs' },
  { '^premake4 ', 'regenerates the build files the suite runs from (./build.sh did it)' },
  { '^make %-C build', 'rebuilds the binary under test (./build.sh did it)' },
  { '^sbatch ', 'needs a Slurm cluster' },
  { '%-H node1:', 'needs two machines named node1 and node2' },
  { 'tests/chaos/chaos%.sh', 'the chaos test (the mpi suite runs its short version)' },
  { '^benchmarks/gpu_', 'needs the GPU machine' },
  { '^tests/gpu/run%.sh', 'needs the GPU machine' },
  { '^benchmarks/cpu_compare%.sh', 'installs PyTorch from PyPI and runs minutes of benchmarks' },
  -- its training column times the small-Llama CPU step (width 512, vocab
  -- 32000): ~45 s even at --mb=1 on CI's 2 cores
  { '^fsdp%-lua benchmarks/data_loader%.lua', 'a benchmark timing the small-Llama training step (run by hand)' },
}

-- Commands shortened by appending options (the last value of an option
-- given twice wins). Matched against the command's text.
local SIZES = {
  { 'llama2_7b%.lua .*%-%-max_steps=200', '--max_steps=8 --warmup_steps=2' },
  -- a sweep starts one process per point: a smaller model per point
  { '^fsdp%-lua recipes/sweep%.lua', "--steps=1 --args='--num_layers=1 --hidden_width=32 --num_heads=4 "
    .. "--vocab_size=64 --seq_len=16'" },
  -- the default 7B is refused by the fit check on any machine under 107 GiB:
  -- on any machine with this budget (a bigger one would start training 7B)
  { '^fsdp%-lua recipes/llama2_7b%.lua$', '--memory_limit_mb=23000' },
  -- T5 fine-tuning on the example pairs (about a minute as written)
  { '^fsdp%-lua recipes/t5_3b%.lua .*%-%-data=examples/', '--max_steps=10 --warmup_steps=2 --validation_freq=5 --eval_examples=4' },
}

-- Files the README's commands read as a reader's own (a corpus to
-- tokenize), made in the scratch directory before anything runs.
-- (tests.data.corpus's options: enough documents that the val split holds a batch).
local INPUTS = {
  ['corpus.txt'] = { documents = 2000, seed = 1 },
  ['a.jsonl'] = { documents = 1000, seed = 2, jsonl = true },
  ['b.jsonl'] = { documents = 1000, seed = 3, jsonl = true },
  ['notes.jsonl'] = { documents = 100, seed = 4, jsonl = true, field = 'body' },
}

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function trim(s) return (s:gsub('^%s+', ''):gsub('%s+$', '')) end
local function read_file(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end
local function write_file(path, text)
  local f = assert(io.open(path, 'wb'))
  f:write(text)
  f:close()
end

-- Blocks ----------------------------------------------------------------------

local SHELL = { sh = true, bash = true, shell = true }

-- { line =, lang =, text =, skip = reason | nil, continues = bool }
local function parse_blocks(text)
  local lines = {}
  for l in (text .. '\n'):gmatch('(.-)\r?\n') do lines[#lines + 1] = l end
  local blocks, errors = {}, {}
  local directive, directive_line
  local i = 1
  while i <= #lines do
    local l = lines[i]
    local indent, lang = l:match('^(%s*)```%s*([%w_+-]*)%s*$')
    local comment = l:match('^%s*<!%-%-%s*readme%-test:(.-)%-%->%s*$')
    if comment then
      directive, directive_line = trim(comment), i
    elseif indent then
      local body, j = {}, i + 1
      while j <= #lines and not lines[j]:match('^%s*```%s*$') do
        body[#body + 1] = lines[j]:sub(1, #indent) == indent and lines[j]:sub(#indent + 1) or lines[j]
        j = j + 1
      end
      local b = { line = i, last = j, lang = lang, text = table.concat(body, '\n') }
      if directive then
        local why = directive:match('^skip%s*%((.*)%)$')
        if why and why ~= '' then b.skip = why
        elseif directive == 'continues' then b.continues = true
        else
          errors[#errors + 1] = ('line %d: unknown readme-test comment %q (skip (why) or continues)')
            :format(directive_line, directive)
        end
        if b.continues and lang ~= 'lua' then
          errors[#errors + 1] = ('line %d: `continues` marks a lua block, this one is %q')
            :format(directive_line, lang)
        end
      end
      directive = nil
      blocks[#blocks + 1] = b
      i = j
    elseif trim(l) ~= '' then
      directive = nil  -- a directive belongs to the block right after it
    end
    i = i + 1
  end
  return blocks, errors
end

-- The text of a command line before its comment (a `#` outside quotes,
-- after a blank or at the start), and the comment.
local function split_comment(line)
  local quote
  for k = 1, #line do
    local c = line:sub(k, k)
    if quote then
      if c == quote then quote = nil end
    elseif c == "'" or c == '"' then quote = c
    elseif c == '#' and (k == 1 or line:sub(k - 1, k - 1):match('%s')) then
      return line:sub(1, k - 1), trim(line:sub(k + 1))
    end
  end
  return line, nil
end

-- A shell block's commands: { line =, code = (without comments), comments = {...} }.
-- Comment lines right after a command (indented or not) are its comments.
local function parse_commands(block)
  local cmds, cur = {}, nil
  local continuing = false
  local n = 0
  for l in (block.text .. '\n'):gmatch('(.-)\n') do
    n = n + 1
    local code, comment = split_comment(l)
    if continuing then
      cur.code = cur.code .. '\n' .. code
      if comment then cur.comments[#cur.comments + 1] = comment end
      continuing = code:match('\\%s*$') ~= nil
    elseif trim(code) == '' then
      if comment and cur then cur.comments[#cur.comments + 1] = comment
      elseif not comment then cur = nil end
    else
      cur = { line = block.line + n, code = code, comments = {} }
      if comment then cur.comments[1] = comment end
      cmds[#cmds + 1] = cur
      continuing = code:match('\\%s*$') ~= nil
    end
  end
  for _, c in ipairs(cmds) do c.code = trim(c.code) end
  return cmds
end

-- The input of a REPL transcript, one string per input.
local function repl_inputs(text)
  local inputs = {}
  for l in (text .. '\n'):gmatch('(.-)\n') do
    local first = l:match('^> ?(.*)$')
    local more = l:match('^>> ?(.*)$')
    if more and #inputs > 0 then inputs[#inputs] = inputs[#inputs] .. '\n' .. more
    elseif first and not more then inputs[#inputs + 1] = first end
  end
  return inputs
end
local function is_transcript(text) return text:match('^%s*> ') ~= nil end

-- Running ----------------------------------------------------------------------

-- The repository's top-level entries: only what git tracks (and build/,
-- the binary under test), so an output a command writes (logs/,
-- sweep_out/) lands in the scratch directory, never in a stray directory
-- of the checkout that a later `git add -A` would commit. Outside a git
-- checkout, every entry.
local top_level = {}
do
  local p = io.popen('git -C ' .. sh_quote(root) .. ' ls-tree --name-only HEAD 2>/dev/null')
  for name in p:lines() do top_level[#top_level + 1] = name end
  p:close()
  if #top_level == 0 then
    p = io.popen('ls -A ' .. sh_quote(root))
    for name in p:lines() do if name ~= '.git' then top_level[#top_level + 1] = name end end
    p:close()
  else
    top_level[#top_level + 1] = 'build'
  end
end

-- INPUTS, made once and linked into each file's scratch directory.
local base = trim(io.popen('mktemp -d "${TMPDIR:-/tmp}/fsdp-readme.XXXXXX"'):read('*a'))
assert(base ~= '', 'mktemp failed')
do
  package.path = root .. '/?.lua;' .. package.path
  local corpus = require 'tests.data.corpus'
  os.execute('mkdir -p ' .. sh_quote(base .. '/inputs'))
  for name, opts in pairs(INPUTS) do corpus.write(base .. '/inputs/' .. name, opts) end
end

-- A fresh scratch directory per file: the repository mirrored, the
-- inputs, its own tmp/ and var/tmp/.
local scratch
local n_scratch = 0
local function new_scratch()
  n_scratch = n_scratch + 1
  scratch = ('%s/%d'):format(base, n_scratch)
  os.execute(('mkdir -p %s %s'):format(sh_quote(scratch .. '/tmp'), sh_quote(scratch .. '/var/tmp')))
  for _, name in ipairs(top_level) do
    os.execute(('ln -s %s %s'):format(sh_quote(root .. '/' .. name), sh_quote(scratch .. '/' .. name)))
  end
  for name in pairs(INPUTS) do
    os.execute(('ln -s %s %s'):format(sh_quote(base .. '/inputs/' .. name), sh_quote(scratch .. '/' .. name)))
  end
end

-- The text of a command or snippet with its /tmp/ and /var/tmp/ paths
-- moved under the scratch directory: a path's start (not inside another
-- path or word), one pass, so the scratch path itself is never moved again.
local function own_tmp(text)
  return (('\n' .. text):gsub('([^%w%._~$/-])(/[%w/]*)', function(before, path)
    for _, shared in ipairs({ '/tmp/', '/var/tmp/' }) do
      if path:sub(1, #shared) == shared then return before .. scratch .. path end
    end
  end):sub(2))
end

local exports = {}   -- `export` commands seen so far, replayed before each command

-- Run a bash script from the scratch directory; returns status, output.
local function run_bash(script)
  local file = scratch .. '/.case.sh'
  write_file(file, table.concat({
    'cd ' .. sh_quote(scratch),
    -- containers forbid Open MPI's cross-process reads (TOOLCHAIN.md); not a reader's concern
    'export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}',
    'export PATH=' .. sh_quote(root .. '/build/bin') .. ':"$PATH"',
    table.concat(exports, '\n'),
    script, '' }, '\n'))
  local out, rcfile = scratch .. '/.case.out', scratch .. '/.case.rc'
  os.execute(('bash -c %s </dev/null >%s 2>&1'):format(sh_quote(
    'source ' .. sh_quote(root .. '/tests/bounded.sh') .. '; IDLE=60 CAP=300; bounded bash '
    .. sh_quote(file) .. '; echo $? >' .. sh_quote(rcfile)), sh_quote(out)))
  local rc = tonumber(read_file(rcfile)) or -1
  return rc, read_file(out)
end

local clock = require 'fsdp.clock'
local n, failed, skipped = 0, 0, 0
local file        -- the file being run, as named in the report (README.md, docs/gpu.md)
local stat        -- its counts: { passed =, failed =, skipped =, blocks_run =, blocks_skipped = }
local started = clock.now()
-- Reports a test; returns whether it ran (not skipped).
local function report(ok, name, detail, skip)
  n = n + 1
  local took = clock.now() - started
  started = clock.now()
  name = name:gsub('\n', ' ')
  if #name > 110 then name = name:sub(1, 107) .. '...' end
  if skip then
    skipped = skipped + 1
    stat.skipped = stat.skipped + 1
    print(('ok %d - %s # SKIP %s'):format(n, name, skip))
  elseif ok then
    stat.passed = stat.passed + 1
    print(('ok %d - %s (%.1f s)'):format(n, name, took))
  else
    failed = failed + 1
    stat.failed = stat.failed + 1
    print(('not ok %d - %s (%.1f s)'):format(n, name, took))
    for l in (detail .. '\n'):gmatch('(.-)\n') do print('#   ' .. l) end
  end
  io.stdout:flush()
  return skip == nil
end

local function tail(text, count)
  local lines = {}
  for l in (text .. '\n'):gmatch('(.-)\n') do lines[#lines + 1] = l end
  return table.concat(lines, '\n', math.max(1, #lines - count + 1))
end

-- Does `out` contain the pieces of `expected` (split at `...`) in order?
local function shows(out, expected)
  local flat = out:gsub('%s+', ' ')
  local pos = 1
  for piece in (expected .. '...'):gmatch('(.-)%.%.%.') do
    piece = trim(piece:gsub('%s+', ' '))
    if piece ~= '' then
      local s, e = flat:find(piece, pos, true)
      if not s then return false end
      pos = e + 1
    end
  end
  return true
end

local function run_command(c)
  local name = ('%s:%d %s'):format(file, c.line, c.code)
  for _, s in ipairs(SKIP) do
    if c.code:match(s[1]) then return report(true, name, nil, s[2]) end
  end
  local code = c.code
  for _, s in ipairs(SIZES) do
    if code:match(s[1]) then code = code .. ' ' .. s[2]; name = name .. ' [+ ' .. s[2] .. ']' end
  end
  local expected
  for _, comment in ipairs(c.comments) do expected = expected or comment:match('^(fsdp%-lua:.*)$') end
  code = own_tmp(code)
  local rc, out = run_bash(code)
  if code:match('^export ') then exports[#exports + 1] = code end
  if expected then
    local ok = rc ~= 0 and rc ~= 124 and shows(out, expected)
    return report(ok, name, ('expected a failure showing %q; exit status %d, output:\n%s')
      :format(expected, rc, tail(out, 20)))
  else
    return report(rc == 0, name, ('exit status %d%s, output:\n%s'):format(rc,
      rc == 124 and ' (stopped: no output for 60 s)' or '', tail(out, 30)))
  end
end

local function lua_script(code, transcript)
  if not transcript then return code end
  local inputs = {}
  for _, input in ipairs(repl_inputs(code)) do inputs[#inputs + 1] = ('%q'):format(input) end
  return ([[
local repl = require 'fsdp.repl'
repl.setup()
for i, input in ipairs({%s}) do
  if repl.eval(input) ~= true then
    io.stderr:write('REPL input ', i, ' failed: ', input, '\n')
    os.exit(1)
  end
end
]]):format(table.concat(inputs, ',\n'))
end

-- A script snippet runs with globals that fail when read undefined: a
-- snippet using a variable no earlier line (nor one it continues)
-- defined is an error even where nil would go unnoticed.
local STRICT = [[
local chunk = assert(loadfile('.snippet.lua'))
setfenv(chunk, setmetatable({}, {
  __index = function(_, k)
    local v = _G[k]
    if v == nil then error(("the snippet reads the undefined variable '%s'"):format(tostring(k)), 2) end
    return v
  end }))
chunk()
]]

local function run_lua(b, code, transcript)
  local name = ('%s:%d lua%s'):format(file, b.line, b.continues and ' (continued)' or '')
  local first = b.text:match('^%s*([^\n]*)') or ''
  name = name .. ': ' .. first
  if b.skip then return report(true, name, nil, b.skip) end
  write_file(scratch .. '/.snippet.lua', own_tmp(code))
  write_file(scratch .. '/.strict.lua', STRICT)
  local rc, out = run_bash(transcript and 'fsdp-lua .snippet.lua' or 'fsdp-lua .strict.lua')
  return report(rc == 0, name, ('exit status %d, output:\n%s\n-- the script:\n%s'):format(rc, tail(out, 30), code))
end

-- Links ------------------------------------------------------------------------

-- The anchors GitHub gives a Markdown text's headings: lower case, all but
-- letters, digits, spaces, '-' and '_' dropped, spaces as '-'; a heading
-- met again gets -1, -2, ...
local function anchors_of(text)
  local set, seen, fence = {}, {}, false
  for l in (text .. '\n'):gmatch('(.-)\r?\n') do
    if l:match('^%s*```') then fence = not fence
    elseif not fence then
      local h = l:match('^#+%s+(.-)%s*$')
      if h then
        local a = h:lower():gsub('[^%w _%-]', ''):gsub(' ', '-')
        if seen[a] then seen[a] = seen[a] + 1; set[a .. '-' .. seen[a]] = true
        else seen[a] = 0; set[a] = true end
      end
    end
  end
  return set
end

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() return true end
  return false
end

-- Every relative link of `text` (the file at `full`, reported as `path`)
-- names a file that exists and, for a .md file, an anchor among its headings.
local function check_links(path, full_path, text)
  local dir = full_path:match('^(.*)/[^/]*$') or '.'
  local bad, count, fence = {}, 0, false
  local n_line = 0
  for l in (text .. '\n'):gmatch('(.-)\r?\n') do
    n_line = n_line + 1
    if l:match('^%s*```') then fence = not fence
    elseif not fence then
      for target in l:gmatch('%]%(([^)%s]+)%)') do
        if not target:match('^%a[%w+.-]*:') then   -- not https:, mailto:
          count = count + 1
          local file_part, anchor = target:match('^([^#]*)#?(.*)$')
          local full = file_part == '' and full_path or dir .. '/' .. file_part
          if file_part ~= '' and not exists(full) and not exists(full .. '/.') then
            bad[#bad + 1] = ('line %d: %s: no such file'):format(n_line, target)
          elseif anchor ~= '' and full:match('%.md$') and not anchors_of(read_file(full))[anchor] then
            bad[#bad + 1] = ('line %d: %s: no heading with that anchor'):format(n_line, target)
          end
        end
      end
    end
  end
  report(#bad == 0, ('%s: its %d relative links lead to a file and heading'):format(path, count),
    table.concat(bad, '\n'))
end

-- Main -------------------------------------------------------------------------

-- The files: the arguments, or README.md and every docs/*.md.
local files = {}
for i = 1, #arg do files[#files + 1] = arg[i] end
if #files == 0 then
  files[1] = 'README.md'
  local p = io.popen('cd ' .. sh_quote(root) .. ' && ls docs/*.md')
  for name in p:lines() do files[#files + 1] = name end
  p:close()
end

-- FSDP_README_ONLY: { [file or '*'] = { line, ... } }
local only
if os.getenv('FSDP_README_ONLY') then
  only = {}
  for item in os.getenv('FSDP_README_ONLY'):gmatch('[^,%s]+') do
    local f, l = item:match('^(.*):(%d+)$')
    if not f then f, l = '*', item:match('^(%d+)$') end
    assert(l, 'FSDP_README_ONLY: expected LINE or FILE:LINE, got ' .. item)
    only[f] = only[f] or {}
    table.insert(only[f], tonumber(l))
  end
end
local function wanted_block(b)
  if not only then return true end
  for _, key in ipairs({ '*', file }) do
    for _, l in ipairs(only[key] or {}) do if l >= b.line and l <= b.last then return true end end
  end
  return false
end

local stats = {}
local function run_file(path)
  local display = path:sub(1, #root + 1) == root .. '/' and path:sub(#root + 2) or path
  local full = path:sub(1, 1) == '/' and path or root .. '/' .. display
  file = display
  stat = { file = display, passed = 0, failed = 0, skipped = 0, blocks_run = 0, blocks_skipped = 0 }
  stats[#stats + 1] = stat
  new_scratch()
  exports = {}
  local text = read_file(full)
  local blocks, errors = parse_blocks(text)
  for _, e in ipairs(errors) do report(false, display .. ' ' .. e, e) end
  if not only then check_links(display, full, text) end
  local previous_lua   -- the code of the lua block before, for `continues`
  for _, b in ipairs(blocks) do
    local wanted = wanted_block(b)
    local ran
    if SHELL[b.lang] then
      for _, c in ipairs(parse_commands(b)) do
        if wanted then
          if b.skip then report(true, ('%s:%d %s'):format(display, c.line, c.code), nil, b.skip)
          elseif run_command(c) then ran = true end
        end
      end
    elseif b.lang == 'lua' then
      local transcript = is_transcript(b.text)
      local code = lua_script(b.text, transcript)
      local broken = false
      if b.continues then
        if not previous_lua then
          broken = report(false, ('%s:%d: continues, but no lua block comes before it'):format(display, b.line), '')
        elseif previous_lua.transcript ~= transcript then
          broken = report(false, ('%s:%d: continues a lua block of the other kind (script / REPL input)')
            :format(display, b.line), '')
        elseif transcript then
          code = lua_script(previous_lua.text .. '\n' .. b.text, true)
        else
          code = previous_lua.code .. '\n-- ' .. display .. ':' .. b.line .. '\n' .. code
        end
      end
      if wanted and not broken then ran = run_lua(b, code, transcript) end
      previous_lua = { code = code, text = (b.continues and previous_lua and previous_lua.text .. '\n' or '') .. b.text,
                       transcript = transcript }
    else
      wanted = false   -- text, not a block that runs
    end
    if wanted then
      if ran then stat.blocks_run = stat.blocks_run + 1 else stat.blocks_skipped = stat.blocks_skipped + 1 end
    end
  end
end

for _, f in ipairs(files) do run_file(f) end
os.execute('rm -rf ' .. sh_quote(base))

-- Per file: blocks run (a shell block counts as run when any of its
-- commands ran) and skipped; then the tests (commands, snippets, links).
print('# file                          blocks run  skipped   tests passed  failed  skipped')
for _, s in ipairs(stats) do
  print(('# %-30s %10d %8d %15d %7d %8d'):format(s.file, s.blocks_run, s.blocks_skipped,
    s.passed, s.failed, s.skipped))
end
print(('1..%d'):format(n))
print(('%d passed, %d failed, %d skipped'):format(n - failed - skipped, failed, skipped))
os.exit(failed == 0 and 0 or 1)
