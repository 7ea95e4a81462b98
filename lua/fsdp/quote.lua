-- fsdp.quote: the one place where a string from a user or a file is
-- written into something another interpreter reads: a command line for
-- /bin/sh (io.popen) and a gnuplot script. Every such site in the tree goes
-- through here (tests/lua/quote_spec.lua holds each one to it).
--
--   local quote = require 'fsdp.quote'
--   local out, rc = quote.capture({ 'gnuplot', gp })        -- no shell string is ever spliced by hand
--   f:write('set output ', quote.gnuplot(png), '\n')
--
-- [Note: quoting for sh and gnuplot]
-- sh: a word in single quotes is taken literally up to the next quote,
-- which is written as '\'' (close, escaped quote, reopen); nothing else
-- is special inside, so backticks, $( ), globs and newlines stay text.
-- Commands are built from lists of words (command, capture), so a caller
-- cannot forget to quote one.
-- gnuplot expands `cmd` inside double-quoted strings (and anywhere on a
-- command line outside single quotes), which is how a file name ran
-- commands when paths were written with %q (issue 38). Single quotes with
-- the quote doubled do not serve: gnuplot 5.4 misreads '''a' and 'x''''y'
-- (a string that starts with a quote: tests/lua/quote_spec.lua), and nothing in single quotes can
-- hold a line break, which would end the command and start another. So a
-- gnuplot string here is double-quoted with every byte outside a plain set
-- written as an octal escape (\140 for a backtick, \042 for a quote,
-- \012 for a line break): the line then holds no backtick, quote, @ or
-- backslash that gnuplot could act on before it reads the string, and
-- the string is exactly the bytes given, line breaks and UTF-8 included.
-- Only NUL, which ends a C string, cannot be written.
local M = {}

-- A word of a POSIX shell command line: as it is when it holds only
-- characters no shell treats specially (so printed commands stay
-- readable; NAME=... alone is quoted, since first on a line it would set a
-- variable), else single-quoted.
function M.shell(s)
  s = tostring(s)
  if s ~= '' and not s:find('[^%w%-_./:=@,+%%]') and not s:find('^[%a_][%w_]*=') then return s end
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- A command line of words (a list), each quoted.
function M.command(words)
  if type(words) ~= 'table' then error('fsdp.quote: command takes a list of words, not ' .. type(words), 2) end
  local out = {}
  for i, w in ipairs(words) do out[i] = M.shell(w) end
  return table.concat(out, ' ')
end

-- Run a list of words through /bin/sh; returns its output (stdout and
-- stderr together) and exit status (127: not found; -1: no status).
function M.capture(words)
  local p = assert(io.popen(M.command(words) .. ' 2>&1; echo "@rc=$?"'))
  local out = p:read('*a')
  p:close()
  local body, rc = out:match('^(.-)@rc=(%d+)\n?$')
  return body or out, tonumber(rc) or -1
end

-- What a string looks like in an error: control characters escaped, so
-- the message stays one line.
function M.shown(s)
  return '"' .. tostring(s):gsub('[%c"\\]', function(c)
    if c == '\n' then return '\\n' end
    if c == '"' or c == '\\' then return '\\' .. c end
    return ('\\%03d'):format(c:byte())
  end) .. '"'
end

-- A gnuplot string constant holding s exactly (a path, a name, a
-- title); raises naming s when it holds a NUL byte.
function M.gnuplot(s)
  s = tostring(s)
  if s:find('%z') then error(('%s holds a NUL byte, which a gnuplot string cannot hold'):format(M.shown(s)), 0) end
  return '"' .. s:gsub('[^%w %-_./,:+=]', function(c) return ('\\%03o'):format(c:byte()) end) .. '"'
end

return M
