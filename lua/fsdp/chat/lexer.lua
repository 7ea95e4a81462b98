-- fsdp.chat.lexer: a chat template's text into tokens, with the whitespace
-- rules of the environment transformers renders in (jinja2 with
-- trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
--   * `{%-` / `{{-` / `{#-` strip all whitespace before the tag, `-%}` /
--     `-}}` / `-#}` all whitespace after it;
--   * a block tag or comment that has only spaces/tabs before it on its line
--     takes them away (lstrip_blocks), unless written `{%+`;
--   * the first newline after a block tag or comment goes (trim_blocks),
--     unless written `+%}`;
--   * \r\n and \r read as \n, and one trailing newline of the template goes.
-- Tokens: {t='data', v=text}, {t='var_begin'}, {t='block_begin'},
-- {t='var_end'}, {t='block_end'}, and inside tags {t='name'|'string'|'int'|
-- 'float'|'op', v=...}; each carries its 1-based template line in .line.
local values = require 'fsdp.chat.values'

local M = {}

local OPS = { '//', '**', '==', '!=', '<=', '>=', '+', '-', '/', '*', '%', '~', '<', '>', '=', '.', ',', ':',
  '|', '(', ')', '[', ']', '{', '}' }
local CLOSE = { ['('] = ')', ['['] = ']', ['{'] = '}' }

local SIMPLE_ESC = { n = '\n', t = '\t', r = '\r', ['\\'] = '\\', ["'"] = "'", ['"'] = '"', a = '\a', b = '\b',
  f = '\f', v = '\v', ['\n'] = '' }

-- Python's unicode-escape decoding of a string literal's body.
local function unescape(body)
  if not body:find('\\', 1, true) then return body end
  local out, i, n = {}, 1, #body
  while i <= n do
    local c = body:sub(i, i)
    if c ~= '\\' or i == n then
      out[#out + 1] = c; i = i + 1
    else
      local d = body:sub(i + 1, i + 1)
      if SIMPLE_ESC[d] then
        out[#out + 1] = SIMPLE_ESC[d]; i = i + 2
      elseif d == 'x' and body:sub(i + 2, i + 3):match('^%x%x$') then
        out[#out + 1] = values.utf8_encode(tonumber(body:sub(i + 2, i + 3), 16)); i = i + 4
      elseif d == 'u' and body:sub(i + 2, i + 5):match('^%x%x%x%x$') then
        out[#out + 1] = values.utf8_encode(tonumber(body:sub(i + 2, i + 5), 16)); i = i + 6
      elseif d == 'U' and body:sub(i + 2, i + 9):match('^%x%x%x%x%x%x%x%x$') then
        out[#out + 1] = values.utf8_encode(tonumber(body:sub(i + 2, i + 9), 16)); i = i + 10
      elseif d:match('[0-7]') then
        local oct = body:match('^[0-7][0-7]?[0-7]?', i + 1)
        out[#out + 1] = values.utf8_encode(tonumber(oct, 8)); i = i + 1 + #oct
      else
        out[#out + 1] = '\\' .. d; i = i + 2
      end
    end
  end
  return table.concat(out)
end

local function count_nl(s) local _, n = s:gsub('\n', ''); return n end

-- The tokens of `source`; errors are "line N: message".
function M.tokenize(source)
  source = source:gsub('\r\n', '\n'):gsub('\r', '\n')
  if source:sub(-1) == '\n' then source = source:sub(1, -2) end
  local toks = {}
  local pos, line, n = 1, 1, #source
  local line_starting = true
  local function emit(t, v, ln) toks[#toks + 1] = { t = t, v = v, line = ln or line } end
  local function fail(msg, ln) error(('line %d: %s'):format(ln or line, msg), 0) end

  while pos <= n do
    local s = source:find('{[{%%#]', pos)
    if not s then
      emit('data', source:sub(pos))
      break
    end
    local kind = source:sub(s + 1, s + 1)
    local sign = source:sub(s + 2, s + 2)
    if sign ~= '-' and sign ~= '+' then sign = '' end
    local text = source:sub(pos, s - 1)
    if sign == '-' then
      text = text:match('^(.-)%s*$')
    elseif sign ~= '+' and kind ~= '{' then
      local l_pos = 0
      local last = text:find('\n[^\n]*$')
      if last then l_pos = last end
      if l_pos > 0 or line_starting then
        local rest = text:sub(l_pos + 1)
        if rest ~= '' and rest:match('^[ \t\v\f]+$') then text = text:sub(1, l_pos) end
      end
    end
    if text ~= '' then emit('data', text) end
    line = line + count_nl(source:sub(pos, s - 1))
    local tag_line = line
    pos = s + 2 + #sign

    if kind == '#' then
      local e = source:find('#}', pos, true)
      if not e then fail('Missing end of comment tag', tag_line) end
      local before = e > pos and source:sub(e - 1, e - 1) or ''
      line = line + count_nl(source:sub(pos, e - 1))
      pos = e + 2
      if before == '-' then
        local ws = source:match('^%s*', pos); line = line + count_nl(ws); pos = pos + #ws
        line_starting = ws:sub(-1) == '\n'
      elseif before == '+' then
        line_starting = false
      else
        if source:sub(pos, pos) == '\n' then pos = pos + 1; line = line + 1; line_starting = true
        else line_starting = false end
      end
    else
      local is_block = kind == '%'
      if is_block and source:find('^%s*raw%s*[-+]?%%}', pos) then
        fail("the 'raw' tag is outside the supported subset", tag_line)
      end
      emit(is_block and 'block_begin' or 'var_begin', nil, tag_line)
      local stack = {}
      while true do
        local ws = source:match('^%s*', pos)
        line = line + count_nl(ws)
        pos = pos + #ws
        if pos > n then fail(is_block and "unexpected end of template, expected '%}'" or
          "unexpected end of template, expected '}}'", tag_line) end
        local closed = false
        if #stack == 0 then
          local close = is_block and '%}' or '}}'
          local csign = ''
          if source:sub(pos, pos + 2) == '-' .. close then csign = '-'
          elseif is_block and source:sub(pos, pos + 2) == '+' .. close then csign = '+' end
          if csign ~= '' or source:sub(pos, pos + 1) == close then
            pos = pos + #csign + 2
            emit(is_block and 'block_end' or 'var_end')
            if csign == '-' then
              local w = source:match('^%s*', pos); line = line + count_nl(w); pos = pos + #w
              line_starting = w:sub(-1) == '\n'
            elseif csign == '' and is_block and source:sub(pos, pos) == '\n' then
              pos = pos + 1; line = line + 1; line_starting = true
            else
              line_starting = false
            end
            closed = true
          end
        end
        if closed then break end
        local c = source:sub(pos, pos)
        if c == '"' or c == "'" then
          local j = pos + 1
          while true do
            local k = source:find('[\\' .. c .. ']', j)
            if not k then fail('unexpected char ' .. values.str_repr(c), line) end
            if source:sub(k, k) == '\\' then j = k + 2 else j = k; break end
          end
          local body = source:sub(pos + 1, j - 1)
          emit('string', unescape(body))
          line = line + count_nl(body)
          pos = j + 1
        elseif c:match('[%a_]') then
          local name = source:match('^[%w_]+', pos)
          emit('name', name)
          pos = pos + #name
        elseif c:match('%d') then
          local prev = toks[#toks]
          local num = source:match('^%d[%d_]*', pos)
          local fl = nil
          if not (prev and prev.t == 'op' and prev.v == '.') then
            fl = source:match('^%d[%d_]*%.%d[%d_]*[eE][-+]?%d[%d_]*', pos)
              or source:match('^%d[%d_]*%.%d[%d_]*', pos)
              or source:match('^%d[%d_]*[eE][-+]?%d[%d_]*', pos)
          end
          if fl then
            emit('float', values.float(tonumber((fl:gsub('_', '')))))
            pos = pos + #fl
          else
            emit('int', tonumber((num:gsub('_', ''))))
            pos = pos + #num
          end
        else
          local op
          for _, o in ipairs(OPS) do
            if source:sub(pos, pos + #o - 1) == o then op = o; break end
          end
          if not op then fail('unexpected char ' .. values.str_repr(c), line) end
          if CLOSE[op] then stack[#stack + 1] = CLOSE[op]
          elseif op == ')' or op == ']' or op == '}' then
            local want = table.remove(stack)
            if want ~= op then
              fail(want and ("unexpected '%s', expected '%s'"):format(op, want) or ("unexpected '%s'"):format(op), line)
            end
          end
          emit('op', op)
          pos = pos + #op
        end
      end
    end
  end
  return toks
end

return M
