-- fsdp.chat.parser: tokens of a chat template (fsdp.chat.lexer) into a tree
-- for fsdp.chat.eval, with jinja2's grammar and operator precedence:
--   cond-expr  a if c else b           (loosest)
--   or, and, not
--   comparisons  == != < <= > >= in, not in   (chained)
--   + -   then ~   then * / // %   then **
--   unary - +, then postfix: .attr [key] [a:b:c] (args), then |filter and
--   `is` test (so `not x is none` is `not (x is none)`)
-- Statements: if/elif/else, for (target tuples, `if` filter, else, the
-- loop variable), set (name, ns.attr, tuples, block set), macro with
-- defaults, with, filter blocks, break/continue (transformers enables
-- jinja2.ext.loopcontrols), print, and transformers' {% generation %}.
-- Every other tag, and every filter or test the evaluator lacks, is refused
-- here, at compile time, naming the line.
local M = {}

local function fail(tok, msg) error(('line %d: %s'):format(tok and tok.line or 0, msg), 0) end

local Parser = {}
Parser.__index = Parser

function Parser:peek(k) return self.toks[self.i + (k or 0)] end
function Parser:next() local t = self.toks[self.i]; self.i = self.i + 1; return t end
function Parser:is(t, v, k)
  local tok = self.toks[self.i + (k or 0)]
  return tok and tok.t == t and (v == nil or tok.v == v)
end
function Parser:skip(t, v) if self:is(t, v) then return self:next() end end
function Parser:expect(t, v)
  local tok = self:peek()
  if not tok or tok.t ~= t or (v ~= nil and tok.v ~= v) then
    local got = tok and (tok.v ~= nil and tostring(tok.v) or tok.t) or 'end of template'
    fail(tok or self.toks[#self.toks], ("expected %s, got '%s'"):format(v and ("'" .. v .. "'") or t, got))
  end
  return self:next()
end

------------------------------------------------------------------------------
-- expressions

function Parser:expression(with_cond)
  if with_cond == false then return self:or_expr() end
  local e = self:or_expr()
  while self:is('name', 'if') do
    local line = self:next().line
    local test = self:or_expr()
    local other
    if self:skip('name', 'else') then other = self:expression() end
    e = { k = 'cond', test = test, a = e, b = other, line = line }
  end
  return e
end

function Parser:or_expr()
  local e = self:and_expr()
  while self:is('name', 'or') do self:next(); e = { k = 'or', a = e, b = self:and_expr() } end
  return e
end

function Parser:and_expr()
  local e = self:not_expr()
  while self:is('name', 'and') do self:next(); e = { k = 'and', a = e, b = self:not_expr() } end
  return e
end

function Parser:not_expr()
  if self:is('name', 'not') then self:next(); return { k = 'not', e = self:not_expr() } end
  return self:compare()
end

local CMP = { ['=='] = true, ['!='] = true, ['<'] = true, ['<='] = true, ['>'] = true, ['>='] = true }

function Parser:compare()
  local first = self:math1()
  local ops = {}
  while true do
    local tok = self:peek()
    if tok and tok.t == 'op' and CMP[tok.v] then
      self:next(); ops[#ops + 1] = { op = tok.v, e = self:math1(), line = tok.line }
    elseif self:is('name', 'in') then
      local line = self:next().line
      ops[#ops + 1] = { op = 'in', e = self:math1(), line = line }
    elseif self:is('name', 'not') and self:is('name', 'in', 1) then
      local line = self:next().line; self:next()
      ops[#ops + 1] = { op = 'notin', e = self:math1(), line = line }
    else break end
  end
  if #ops == 0 then return first end
  return { k = 'compare', first = first, ops = ops }
end

function Parser:math1()
  local e = self:concat()
  while self:is('op', '+') or self:is('op', '-') do
    local tok = self:next()
    e = { k = 'bin', op = tok.v, a = e, b = self:concat(), line = tok.line }
  end
  return e
end

function Parser:concat()
  local items = { self:math2() }
  while self:is('op', '~') do self:next(); items[#items + 1] = self:math2() end
  if #items == 1 then return items[1] end
  return { k = 'concat', items = items }
end

function Parser:math2()
  local e = self:pow()
  while self:is('op', '*') or self:is('op', '/') or self:is('op', '//') or self:is('op', '%') do
    local tok = self:next()
    e = { k = 'bin', op = tok.v, a = e, b = self:pow(), line = tok.line }
  end
  return e
end

function Parser:pow()
  local e = self:unary()
  while self:is('op', '**') do
    local tok = self:next()
    e = { k = 'bin', op = '**', a = e, b = self:unary(), line = tok.line }
  end
  return e
end

function Parser:unary(with_filter)
  local e
  local tok = self:peek()
  if tok and tok.t == 'op' and (tok.v == '-' or tok.v == '+') then
    self:next()
    e = { k = 'unary', op = tok.v, e = self:unary(false), line = tok.line }
  else
    e = self:primary()
  end
  e = self:postfix(e)
  if with_filter ~= false then e = self:filter_expr(e) end
  return e
end

function Parser:primary()
  local tok = self:next()
  if not tok then fail(self.toks[#self.toks], 'unexpected end of template') end
  if tok.t == 'name' then
    local v = tok.v
    if v == 'true' or v == 'True' then return { k = 'const', v = true } end
    if v == 'false' or v == 'False' then return { k = 'const', v = false } end
    if v == 'none' or v == 'None' then return { k = 'const', v = self.values.NONE } end
    return { k = 'name', n = v, line = tok.line }
  elseif tok.t == 'string' then
    local s = tok.v
    while self:is('string') do s = s .. self:next().v end
    return { k = 'const', v = s }
  elseif tok.t == 'int' or tok.t == 'float' then
    return { k = 'const', v = tok.v }
  elseif tok.t == 'op' and tok.v == '(' then
    if self:skip('op', ')') then return { k = 'tuple', items = {} } end
    local e = self:expression()
    if self:is('op', ',') then
      local items = { e }
      while self:skip('op', ',') do
        if self:is('op', ')') then break end
        items[#items + 1] = self:expression()
      end
      self:expect('op', ')')
      return { k = 'tuple', items = items }
    end
    self:expect('op', ')')
    return e
  elseif tok.t == 'op' and tok.v == '[' then
    local items = {}
    while not self:is('op', ']') do
      if #items > 0 then self:expect('op', ',') end
      if self:is('op', ']') then break end
      items[#items + 1] = self:expression()
    end
    self:expect('op', ']')
    return { k = 'list', items = items }
  elseif tok.t == 'op' and tok.v == '{' then
    local pairs_ = {}
    while not self:is('op', '}') do
      if #pairs_ > 0 then self:expect('op', ',') end
      if self:is('op', '}') then break end
      local key = self:expression()
      self:expect('op', ':')
      pairs_[#pairs_ + 1] = { key, self:expression() }
    end
    self:expect('op', '}')
    return { k = 'dict', pairs = pairs_ }
  end
  fail(tok, ("unexpected '%s'"):format(tostring(tok.v or tok.t)))
end

function Parser:call_args()
  local args, kwargs = {}, {}
  self:expect('op', '(')
  while not self:is('op', ')') do
    if #args + #kwargs > 0 then self:expect('op', ',') end
    if self:is('op', ')') then break end
    if self:is('op', '*') or self:is('op', '**') then
      fail(self:peek(), '*args / **kwargs in calls are outside the supported subset')
    end
    if self:is('name') and self:is('op', '=', 1) then
      local name = self:next().v; self:next()
      kwargs[#kwargs + 1] = { name, self:expression() }
    else
      if #kwargs > 0 then fail(self:peek(), 'positional argument after keyword argument') end
      args[#args + 1] = self:expression()
    end
  end
  self:expect('op', ')')
  return args, kwargs
end

function Parser:subscript_part()
  -- one index or slice inside [ ]
  local start, stop, step
  if not self:is('op', ':') then
    start = self:expression()
    if not self:is('op', ':') then return start, false end
  end
  self:expect('op', ':')
  if not self:is('op', ']') and not self:is('op', ':') then stop = self:expression() end
  if self:skip('op', ':') then
    if not self:is('op', ']') then step = self:expression() end
  end
  return { start = start, stop = stop, step = step }, true
end

function Parser:postfix(e)
  while true do
    local tok = self:peek()
    if tok and tok.t == 'op' and tok.v == '.' then
      self:next()
      local a = self:next()
      if a and a.t == 'name' then e = { k = 'getattr', obj = e, attr = a.v, line = a.line }
      elseif a and a.t == 'int' then e = { k = 'getitem', obj = e, key = { k = 'const', v = a.v }, line = a.line }
      else fail(a or tok, 'expected name or number after dot') end
    elseif tok and tok.t == 'op' and tok.v == '[' then
      self:next()
      local part, is_slice = self:subscript_part()
      if self:is('op', ',') then fail(self:peek(), 'tuple subscripts are outside the supported subset') end
      self:expect('op', ']')
      if is_slice then
        e = { k = 'slice', obj = e, start = part.start, stop = part.stop, step = part.step, line = tok.line }
      else
        e = { k = 'getitem', obj = e, key = part, line = tok.line }
      end
    elseif tok and tok.t == 'op' and tok.v == '(' then
      local args, kwargs = self:call_args()
      e = { k = 'call', fn = e, args = args, kwargs = kwargs, line = tok.line }
    else
      return e
    end
  end
end

function Parser:filter_expr(e)
  while true do
    if self:is('op', '|') then
      self:next()
      e = self:filter_call(e)
    elseif self:is('name', 'is') then
      local line = self:next().line
      local negate = self:skip('name', 'not') ~= nil
      local name = self:expect('name').v
      while self:is('op', '.') and self:is('name', nil, 1) do self:next(); name = name .. '.' .. self:next().v end
      if not self.tests[name] then fail({ line = line }, ("No test named '%s'."):format(name)) end
      local args, kwargs = {}, {}
      local tok = self:peek()
      if self:is('op', '(') then
        args, kwargs = self:call_args()
      elseif tok and (tok.t == 'name' or tok.t == 'string' or tok.t == 'int' or tok.t == 'float'
          or (tok.t == 'op' and (tok.v == '(' or tok.v == '[' or tok.v == '{')))
          and not (tok.t == 'name' and (tok.v == 'else' or tok.v == 'or' or tok.v == 'and')) then
        if tok.t == 'name' and tok.v == 'is' then fail(tok, 'You cannot chain multiple tests with is') end
        args = { self:postfix(self:primary()) }
      end
      e = { k = 'test', e = e, name = name, args = args, kwargs = kwargs, negate = negate, line = line }
    else
      return e
    end
  end
end

function Parser:filter_call(e)
  local tok = self:expect('name')
  local name = tok.v
  while self:is('op', '.') and self:is('name', nil, 1) do self:next(); name = name .. '.' .. self:next().v end
  if not self.filters[name] then fail(tok, ("No filter named '%s'."):format(name)) end
  local args, kwargs = {}, {}
  if self:is('op', '(') then args, kwargs = self:call_args() end
  return { k = 'filter', e = e, name = name, args = args, kwargs = kwargs, line = tok.line }
end

------------------------------------------------------------------------------
-- statements

local UNSUPPORTED = { block = true, extends = true, include = true, import = true, from = true,
  autoescape = true, call = true, raw = true, ['do'] = true }

function Parser:assign_target(allow_attr)
  local tok = self:expect('name')
  if allow_attr and self:is('op', '.') then
    self:next()
    local attr = self:expect('name').v
    return { k = 'nsattr', n = tok.v, attr = attr, line = tok.line }
  end
  if self:is('op', ',') then
    local names = { tok.v }
    while self:skip('op', ',') do
      if not self:is('name') then break end
      names[#names + 1] = self:expect('name').v
    end
    return { k = 'tuple', names = names, line = tok.line }
  end
  return { k = 'name', n = tok.v, line = tok.line }
end

function Parser:for_target()
  if self:skip('op', '(') then
    local t = self:assign_target(false)
    self:expect('op', ')')
    return t
  end
  return self:assign_target(false)
end

-- Body until one of the block tags in `ends` (a set); returns body and the
-- name of the tag found (its block_begin and name consumed).
function Parser:subparse(ends)
  local body = {}
  while true do
    local tok = self:peek()
    if not tok then
      if ends then
        local names = {}
        for k in pairs(ends) do names[#names + 1] = "'" .. k .. "'" end
        table.sort(names)
        fail(self.toks[#self.toks], 'unexpected end of template, expected ' .. table.concat(names, ' or '))
      end
      return body
    end
    if tok.t == 'data' then
      self:next(); body[#body + 1] = { k = 'data', v = tok.v }
    elseif tok.t == 'var_begin' then
      self:next()
      local e = self:expression()
      self:expect('var_end')
      body[#body + 1] = { k = 'output', e = e, line = tok.line }
    elseif tok.t == 'block_begin' then
      local name_tok = self:peek(1)
      if not name_tok or name_tok.t ~= 'name' then fail(tok, 'tag name expected') end
      if ends and ends[name_tok.v] then
        self:next(); self:next()
        return body, name_tok.v
      end
      self:next(); self:next()
      body[#body + 1] = self:statement(name_tok)
    else
      fail(tok, ("unexpected '%s'"):format(tostring(tok.v or tok.t)))
    end
  end
end

function Parser:statement(tok)
  local name = tok.v
  if name == 'if' then
    local node = { k = 'if', tests = {}, line = tok.line }
    local cond = self:expression()
    self:expect('block_end')
    while true do
      local body, ended = self:subparse({ elif = true, ['else'] = true, endif = true })
      node.tests[#node.tests + 1] = { cond, body }
      if ended == 'elif' then
        cond = self:expression(); self:expect('block_end')
      elseif ended == 'else' then
        self:expect('block_end')
        node.else_ = self:subparse({ endif = true })
        self:expect('block_end')
        return node
      else
        self:expect('block_end')
        return node
      end
    end
  elseif name == 'for' then
    local target = self:for_target()
    self:expect('name', 'in')
    local iter = self:expression(false)
    local cond
    if self:skip('name', 'if') then cond = self:expression() end
    if self:is('name', 'recursive') then fail(self:peek(), 'recursive loops are outside the supported subset') end
    self:expect('block_end')
    self.loop_depth = self.loop_depth + 1
    local body, ended = self:subparse({ endfor = true, ['else'] = true })
    self.loop_depth = self.loop_depth - 1
    local else_
    self:expect('block_end')
    if ended == 'else' then
      else_ = self:subparse({ endfor = true }); self:expect('block_end')
    end
    return { k = 'for', target = target, iter = iter, cond = cond, body = body, else_ = else_, line = tok.line }
  elseif name == 'set' then
    local target = self:assign_target(true)
    if self:skip('op', '=') then
      local e = self:expression()
      if self:is('op', ',') then
        local items = { e }
        while self:skip('op', ',') do items[#items + 1] = self:expression() end
        e = { k = 'tuple', items = items }
      end
      self:expect('block_end')
      return { k = 'set', target = target, e = e, line = tok.line }
    end
    local filters = {}
    while self:skip('op', '|') do filters[#filters + 1] = self:filter_call({ k = 'const', v = '' }) end
    self:expect('block_end')
    local body = self:subparse({ endset = true })
    self:expect('block_end')
    return { k = 'setblock', target = target, body = body, filters = filters, line = tok.line }
  elseif name == 'macro' then
    local mname = self:expect('name').v
    local params = {}
    self:expect('op', '(')
    while not self:is('op', ')') do
      if #params > 0 then self:expect('op', ',') end
      if self:is('op', ')') then break end
      local pn = self:expect('name').v
      local default
      if self:skip('op', '=') then default = self:expression() end
      params[#params + 1] = { pn, default }
    end
    self:expect('op', ')')
    self:expect('block_end')
    local saved = self.loop_depth
    self.loop_depth = 0
    local body = self:subparse({ endmacro = true })
    self.loop_depth = saved
    self:expect('block_end')
    return { k = 'macro', name = mname, params = params, body = body, line = tok.line }
  elseif name == 'with' then
    local assigns = {}
    while not self:is('block_end') do
      if #assigns > 0 then self:expect('op', ',') end
      local n = self:expect('name').v
      self:expect('op', '=')
      assigns[#assigns + 1] = { n, self:expression() }
    end
    self:expect('block_end')
    local body = self:subparse({ endwith = true })
    self:expect('block_end')
    return { k = 'with', assigns = assigns, body = body, line = tok.line }
  elseif name == 'filter' then
    local filters = { self:filter_call({ k = 'const', v = '' }) }
    while self:skip('op', '|') do filters[#filters + 1] = self:filter_call({ k = 'const', v = '' }) end
    self:expect('block_end')
    local body = self:subparse({ endfilter = true })
    self:expect('block_end')
    return { k = 'filterblock', filters = filters, body = body, line = tok.line }
  elseif name == 'break' or name == 'continue' then
    if self.loop_depth == 0 then fail(tok, ("'%s' outside of a loop"):format(name)) end
    self:expect('block_end')
    return { k = name, line = tok.line }
  elseif name == 'print' then
    local e = self:expression()
    self:expect('block_end')
    return { k = 'output', e = e, line = tok.line }
  elseif name == 'generation' then
    self:expect('block_end')
    local body = self:subparse({ endgeneration = true })
    self:expect('block_end')
    return { k = 'generation', body = body, line = tok.line }
  elseif UNSUPPORTED[name] then
    fail(tok, ("the '%s' tag is outside the supported subset"):format(name))
  end
  fail(tok, ("Encountered unknown tag '%s'."):format(name))
end

-- The tree of a token list. `env` gives the known filters and tests (sets
-- of names) and the value model.
function M.parse(toks, env)
  local p = setmetatable({ toks = toks, i = 1, filters = env.filters, tests = env.tests, values = env.values,
    loop_depth = 0 }, Parser)
  local body = p:subparse(nil)
  return body
end

return M
