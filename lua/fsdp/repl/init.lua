-- repl.lua: the fsdp-lua read-eval-print loop.
--
-- The executable runs require('fsdp.repl').run() when it has no script (or
-- with -i). Each input is compiled first as "return <input>", so that an
-- expression prints its values, and otherwise as a statement; input that
-- fails only because it ends too early ("... near '<eof>'") is continued on
-- the next line. Chunks run with the global environment, so globals persist
-- from one input to the next. Errors are printed and the loop goes on;
-- Ctrl-C cancels the line being typed or interrupts the running chunk;
-- Ctrl-D (end of input) leaves.
--
-- Values are printed by M.print_value, which asks the functions in M.printers
-- first (each takes a value and returns a string, or nil to pass), then
-- tostring (tensors and modules print themselves that way). M.add_printer
-- puts a printer ahead of the others; the last is fsdp.pretty, for plain
-- tables.
--
-- M.run also sets up the session (M.setup): Tab completion of names
-- (fsdp.complete), the globals `help` (fsdp.help) and `fsdp` (the library,
-- when it loads), each only if the user has not defined it.
--
-- This file needs only the host (fsdp.host, built into the executable), not
-- the fsdp library, so the REPL works while the library is broken.

local host = require 'fsdp.host'

-- The REPL keeps its own references: a user who assigns to a global such as
-- `tostring` or `xpcall` at the prompt must not break the prompt.
local io, table, math = io, table, math
local xpcall, pcall, loadstring, tostring, select, type, ipairs, getmetatable =
  xpcall, pcall, loadstring, tostring, select, type, ipairs, getmetatable
local getinfo = debug.getinfo

local M = {}

M.prompt = '> '
M.continuation_prompt = '>> '
M.chunk_name = '=stdin'

-- Printers tried in order before tostring: function(value) -> string | nil.
M.printers = {}

-- Add a printer ahead of those already there (later additions win).
function M.add_printer(fn)
  table.insert(M.printers, 1, fn)
end

local unpack = unpack or table.unpack
local function pack(...) return { n = select('#', ...), ... } end
local max_frames = 22  -- a longer traceback keeps both ends and elides the middle

local function warn(message)
  io.stdout:flush()
  io.stderr:write(message, '\n')
  io.stderr:flush()
end

-- The text shown for one value: the first printer that answers, else
-- tostring. A printer or __tostring that fails does not lose the value.
function M.format_value(value)
  for _, printer in ipairs(M.printers) do
    local ok, text = pcall(printer, value)
    if not ok then
      warn('printer failed: ' .. tostring(text))
    elseif text ~= nil then
      return tostring(text)
    end
  end
  local ok, text = pcall(tostring, value)
  if ok and type(text) == 'string' then return text end
  return ('<%s: tostring failed: %s>'):format(type(value), tostring(text))
end

-- Print values separated by tabs on one line (nils included).
function M.print_value(...)
  local n = select('#', ...)
  local parts = {}
  for i = 1, n do parts[i] = M.format_value((select(i, ...))) end
  io.stdout:write(table.concat(parts, '\t'), '\n')
  io.stdout:flush()
end

local function is_incomplete(message)
  return message:sub(-5) == '<eof>' or message:sub(-7) == "'<eof>'"
end

-- Compile input as an expression, else as a statement.
-- Returns the function, or nil, the error message and whether the input
-- is only incomplete (either form ran out of input).
function M.compile(code)
  local expression_only = code:sub(1, 1) == '='  -- Lua 5.1's "=expr"
  if expression_only then code = code:sub(2) end
  local fn, expr_err = loadstring('return ' .. code, M.chunk_name)
  if fn then
    -- Run the expression as the arguments of a call rather than as the
    -- returned call: "return f()" is a tail call, which would erase the
    -- input's frame, so `error('x')` would lose its "stdin:1:" position and
    -- tracebacks their last line. The newline keeps a trailing comment from
    -- swallowing the parenthesis.
    fn = loadstring('return (function(...) return ... end)(' .. code .. '\n)',
                    M.chunk_name) or fn
    return fn
  end
  if expression_only then return nil, expr_err, is_incomplete(expr_err) end
  local stmt_fn, stmt_err = loadstring(code, M.chunk_name)
  if stmt_fn then return stmt_fn end
  return nil, stmt_err, is_incomplete(expr_err) or is_incomplete(stmt_err)
end

local function error_text(err)
  if type(err) == 'string' or type(err) == 'number' then return tostring(err) end
  local mt = getmetatable(err)
  if type(mt) == 'table' and mt.__tostring then
    local ok, text = pcall(tostring, err)
    if ok and type(text) == 'string' then return text end
  end
  return ('(error object is a %s value)'):format(type(err))
end

-- One traceback line in the format of debug.traceback.
local function frame_text(info)
  local where = info.short_src .. ':'
  if info.currentline and info.currentline > 0 then
    where = where .. info.currentline .. ':'
  end
  local what
  if info.namewhat ~= '' then
    what = ("function '%s'"):format(info.name)
  elseif info.what == 'main' then
    what = 'main chunk'
  elseif info.what == 'C' then
    what = '?'
  else
    what = ('function <%s:%d>'):format(info.short_src, info.linedefined)
  end
  return '\t' .. where .. ' in ' .. what
end

-- The traceback from the error up to the input's chunk, without the frames
-- of this module below it: they only say "the REPL called your code".
-- `level` is the stack level of the function that raised the error.
local function traceback(message, level, chunk)
  local frames = {}
  while true do
    local info = getinfo(level, 'Slnf')
    if info == nil or info.func == xpcall then break end
    frames[#frames + 1] = frame_text(info)
    if info.func == chunk then break end
    level = level + 1
  end
  if #frames > max_frames then
    local half = math.floor(max_frames / 2)
    local kept = { unpack(frames, 1, half) }
    kept[#kept + 1] = '\t...'
    for i = #frames - half + 1, #frames do kept[#kept + 1] = frames[i] end
    frames = kept
  end
  if #frames == 0 then return message end
  return message .. '\nstack traceback:\n' .. table.concat(frames, '\n')
end

-- Whether an error is a library's verdict on the typed input: blamed on
-- the input ("stdin:1: fsdp.plan: unknown option ...", core.fail's level)
-- but raised by a function that is not typed input. Such an error is one
-- line, the typed call is the whole story; an error raised by typed code
-- (error('boom'), t.x on nil) or blamed on a library file (a bug) keeps
-- its traceback. Called by the error handler only: the stack above it
-- (levels 1 this, 2 the handler) is the error's.
function M.is_verdict(err)
  local blame = M.chunk_name:gsub('^[=@]', '') .. ':'
  if type(err) ~= 'string' or err:sub(1, #blame) ~= blame then return false end
  local l = 3
  while true do
    local info = getinfo(l, 'S')
    if info == nil then return false end
    if info.what ~= 'C' then return info.source ~= M.chunk_name end
    l = l + 1
  end
end

-- Run a compiled chunk and print its results or its error.
-- Returns true when it ran without error.
function M.execute(chunk)
  local function on_error(err)
    if M.is_verdict(err) then return err end
    -- Levels: 1 traceback, 2 on_error, 3 where the error was raised.
    -- (Not a tail call: that would remove on_error's level.)
    local text = traceback(error_text(err), 3, chunk)
    return text
  end
  local results = pack(xpcall(chunk, on_error))
  local n = results.n
  if not results[1] then
    warn(tostring(results[2]))
    return false
  end
  if n > 1 then M.print_value(unpack(results, 2, n)) end
  return true
end

-- Evaluate one input. Returns 'incomplete' when more lines are needed,
-- else true (ran) or false (compile or runtime error, already printed).
function M.eval(code)
  local chunk, err, incomplete = M.compile(code)
  if chunk then return M.execute(chunk) end
  if incomplete then return 'incomplete' end
  warn(err)
  return false
end

local function banner()
  local luajit = jit and jit.version or _VERSION
  return ('fsdp-lua %s (%s) -- help() lists what there is; Tab completes; Ctrl-D exits'):format(
    tostring(host.version), luajit)
end

local set_up = false

-- Completion, the table printer and the globals help and fsdp. Each part
-- that fails to load is reported and left out; the loop runs regardless.
function M.setup()
  if set_up then return end
  set_up = true
  -- lazy: optional (pcall): the loop runs without completion
  local ok, complete = pcall(require, 'fsdp.repl.complete')
  if ok then
    host.set_completer(function(before, word) return complete.candidates(before, word) end)
    -- a module prints its tree, then how its numbered children are indexed
    M.printers[#M.printers + 1] = function(v)
      local note = complete.module_note(v)
      if note then return tostring(v) .. '\n' .. note end
    end
  else
    warn('tab completion is off: ' .. tostring(complete))
  end
  -- lazy: optional (pcall): without it values print by tostring
  local pretty_ok, pretty = pcall(require, 'fsdp.repl.pretty')
  if pretty_ok then M.printers[#M.printers + 1] = pretty.format end
  if rawget(_G, 'help') == nil then
    -- lazy: optional (pcall), and only when no global help exists
    local help_ok, help = pcall(require, 'fsdp.repl.help')
    if help_ok then rawset(_G, 'help', help.help) end
  end
  if rawget(_G, 'fsdp') == nil then
    -- lazy: optional (pcall): a library that fails to load is reported, the REPL goes on
    local fsdp_ok, fsdp = pcall(require, 'fsdp')
    if fsdp_ok then
      rawset(_G, 'fsdp', fsdp)
    else
      warn('the fsdp library did not load: ' .. tostring(fsdp))
    end
  end
end

-- The loop. opts.banner (default: stdin is a terminal) prints the banner.
function M.run(opts)
  opts = opts or {}
  local on_terminal = host.isatty(0)
  local show_banner = opts.banner
  if show_banner == nil then show_banner = on_terminal end
  if show_banner then io.stdout:write(banner(), '\n') end
  M.setup()
  local buffer
  while true do
    local line, why = host.readline(buffer and M.continuation_prompt or M.prompt)
    if line == nil and why ~= 'interrupted' then break end
    if line == nil then
      buffer = nil  -- Ctrl-C at the prompt drops the pending input
    else
      host.add_history(line)
      buffer = buffer and (buffer .. '\n' .. line) or line
      -- A Ctrl-C landing between two inputs is an error here, not an exit.
      local ok, status = pcall(M.eval, buffer)
      if not ok then warn(error_text(status)) end
      if status ~= 'incomplete' then buffer = nil end
    end
  end
  if on_terminal then io.stdout:write('\n') end
  io.stdout:flush()
end

return M
