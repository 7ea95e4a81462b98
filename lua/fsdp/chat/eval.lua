-- fsdp.chat.eval: runs a parsed chat template (fsdp.chat.parser) on
-- template values (fsdp.chat.values) with jinja2's semantics as
-- transformers configures it (ImmutableSandboxedEnvironment):
--   * scopes: a for-loop body gets a fresh scope on every iteration (so a
--     `set` inside it neither leaks out nor carries to the next iteration:
--     that is what namespace() is for); `if` opens no scope; macros see the
--     scope they were defined in as it is when they are called;
--   * `a.b` tries the Python attribute first (dict methods, str methods),
--     then the item; `a[b]` the item first; a missing one is Undefined, and
--     only an attribute *of* an Undefined is an error;
--   * list and dict mutators (append, update, ...) are refused as the
--     immutable sandbox refuses them;
--   * {% generation %} records the span of its output in the top-level
--     output stream, as transformers' AssistantTracker does (it measures the
--     text yielded so far, so a generation block inside a macro or a block
--     set measures from the top-level position, not its own buffer).
-- Errors carry the template line of the statement or expression at fault.
local values = require 'fsdp.chat.values'
local filters = require 'fsdp.chat.filters'

local NONE, kind, truthy, str = values.NONE, values.kind, values.truthy, values.str

local M = {}

local Interp = {}
Interp.__index = Interp

-- A runtime failure at the current line. Raised as a table so the caller
-- can tell template errors from bugs.
local function rt_error(self, msg, line)
  error({ template_error = true, line = line or self.line, msg = msg }, 0)
end
M.rt_error = rt_error

------------------------------------------------------------------------------
-- scopes

local function new_scope(parent) return { vars = {}, parent = parent } end

local function lookup(scope, name)
  while scope do
    local v = scope.vars[name]
    if v ~= nil then return v end
    scope = scope.parent
  end
  return nil
end

------------------------------------------------------------------------------
-- attribute and item access

local function undefined_error(self, v)
  if v.why then rt_error(self, v.why) end
  rt_error(self, ("'%s' is undefined"):format(v.name or 'value'))
end
M.undefined_error = undefined_error

function Interp:getattr(obj, attr)
  local k = kind(obj)
  if k == 'undefined' then undefined_error(self, obj) end
  local method = filters.method(self, obj, k, attr)
  if method ~= nil then return method end
  if k == 'dict' then
    local v = obj.map[attr]
    if v ~= nil then return v end
    return values.undef(nil, ("'dict object' has no attribute '%s'"):format(attr))
  elseif k == 'namespace' then
    local v = obj.map[attr]
    if v ~= nil then return v end
    return values.undef(nil, ("'Namespace object' has no attribute '%s'"):format(attr))
  elseif k == 'loop' then
    return obj:get(attr)
  end
  return values.undef(nil, ("'%s object' has no attribute '%s'"):format(k, attr))
end

function Interp:getitem(obj, key)
  local k = kind(obj)
  if k == 'undefined' then undefined_error(self, obj) end
  if k == 'dict' or k == 'namespace' then
    local kk = kind(key)
    local lk = key
    if kk == 'float' then lk = key.v end
    if kk == 'bool' then lk = key and 1 or 0 end
    local v = obj.map[lk]
    if v ~= nil then return v end
  elseif k == 'list' or k == 'tuple' or k == 'str' then
    local kk = kind(key)
    if kk == 'int' or kk == 'bool' then
      local i = kk == 'bool' and (key and 1 or 0) or key
      local n = k == 'str' and values.ulen(obj) or obj.n
      if i < 0 then i = i + n end
      if i >= 0 and i < n then
        if k == 'str' then return values.slice_str(obj, i, i + 1, 1) end
        return obj[i + 1]
      end
      return values.undef(nil, ("%s object has no element %s"):format(k, values.repr(key)))
    end
  end
  if type(key) == 'string' then
    local method = filters.method(self, obj, k, key)
    if method ~= nil then return method end
    if k == 'loop' then return obj:get(key) end
  end
  return values.undef(nil, ("'%s object' has no attribute %s"):format(k, values.repr(key)))
end

function Interp:slice(obj, start, stop, step)
  local k = kind(obj)
  if k == 'undefined' then undefined_error(self, obj) end
  local function int_or_nil(v)
    if v == nil or v == NONE then return nil end
    if kind(v) ~= 'int' then rt_error(self, 'slice indices must be integers or None') end
    return v
  end
  start, stop, step = int_or_nil(start), int_or_nil(stop), int_or_nil(step)
  if k == 'str' then return values.slice_str(obj, start, stop, step or 1) end
  if k == 'list' or k == 'tuple' then
    local out = {}
    for i, idx in ipairs(values.slice_indices(obj.n, start, stop, step or 1)) do out[i] = obj[idx + 1] end
    out.n = #out
    return k == 'list' and values.list(out) or values.tuple(out)
  end
  rt_error(self, ("'%s' object is not subscriptable"):format(k))
end

------------------------------------------------------------------------------
-- iteration

-- The items of an iterable value as a Lua array (field n).
function Interp:iterate(v)
  local k = kind(v)
  if k == 'list' or k == 'tuple' then return v end
  if k == 'dict' or k == 'namespace' then
    local out = { n = #v.keys }
    for i, key in ipairs(v.keys) do out[i] = key end
    return out
  end
  if k == 'str' then local c = values.chars(v); c.n = #c; return c end
  if k == 'undefined' then return { n = 0 } end
  if k == 'none' then rt_error(self, "'NoneType' object is not iterable") end
  rt_error(self, ("'%s' object is not iterable"):format(k))
end

------------------------------------------------------------------------------
-- operators

local function arith(self, op, a, b)
  local ka, kb = kind(a), kind(b)
  if ka == 'undefined' then undefined_error(self, a) end
  if kb == 'undefined' then undefined_error(self, b) end
  local na = ka == 'int' or ka == 'float' or ka == 'bool'
  local nb = kb == 'int' or kb == 'float' or kb == 'bool'
  if na and nb then
    local x = ka == 'bool' and (a and 1 or 0) or values.num(a)
    local y = kb == 'bool' and (b and 1 or 0) or values.num(b)
    local is_float = ka == 'float' or kb == 'float'
    local r
    if op == '+' then r = x + y
    elseif op == '-' then r = x - y
    elseif op == '*' then r = x * y
    elseif op == '/' then
      if y == 0 then rt_error(self, 'division by zero') end
      return values.float(x / y)
    elseif op == '//' then
      if y == 0 then rt_error(self, 'integer division or modulo by zero') end
      r = math.floor(x / y)
    elseif op == '%' then
      if y == 0 then rt_error(self, 'integer division or modulo by zero') end
      r = x - math.floor(x / y) * y
    elseif op == '**' then
      r = x ^ y
      if not is_float and y < 0 then is_float = true end
    end
    if is_float then return values.float(r) end
    return r
  end
  if op == '+' then
    if ka == 'str' and kb == 'str' then return a .. b end
    if (ka == 'list' and kb == 'list') or (ka == 'tuple' and kb == 'tuple') then
      local out = { n = a.n + b.n }
      for i = 1, a.n do out[i] = a[i] end
      for i = 1, b.n do out[a.n + i] = b[i] end
      return ka == 'list' and values.list(out) or values.tuple(out)
    end
    if ka == 'str' then rt_error(self, ('can only concatenate str (not "%s") to str'):format(kb)) end
    if ka == 'list' then rt_error(self, ('can only concatenate list (not "%s") to list'):format(kb)) end
  elseif op == '*' then
    local s, n = nil, nil
    if ka == 'str' and kb == 'int' then s, n = a, b elseif kb == 'str' and ka == 'int' then s, n = b, a end
    if s then return n > 0 and string.rep(s, n) or '' end
    local l
    if ka == 'list' and kb == 'int' then l, n = a, b elseif kb == 'list' and ka == 'int' then l, n = b, a end
    if l then
      local out = { n = 0 }
      for _ = 1, math.max(n, 0) do
        for i = 1, l.n do out.n = out.n + 1; out[out.n] = l[i] end
      end
      return values.list(out)
    end
  elseif op == '%' and ka == 'str' then
    rt_error(self, "printf-style '%' string formatting is outside the supported subset")
  end
  rt_error(self, ("unsupported operand type(s) for %s: '%s' and '%s'"):format(op, ka, kb))
end
M.arith = arith
-- (filters reach it through the interpreter they are given: sum adds with +)
Interp.arith = arith

function Interp:contains(container, item)
  local k = kind(container)
  if k == 'str' then
    if kind(item) ~= 'str' then rt_error(self, "'in <string>' requires string as left operand") end
    return container:find(item, 1, true) ~= nil
  end
  if k == 'list' or k == 'tuple' then
    for i = 1, container.n do if values.eq(container[i], item) then return true end end
    return false
  end
  if k == 'dict' or k == 'namespace' then
    local ik = kind(item)
    if ik == 'str' or ik == 'int' then return container.map[item] ~= nil end
    if ik == 'float' then return container.map[item.v] ~= nil end
    return false
  end
  if k == 'undefined' then return false end
  rt_error(self, ("argument of type '%s' is not iterable"):format(k))
end

local function compare(self, op, a, b)
  if op == '==' then return values.eq(a, b) end
  if op == '!=' then return not values.eq(a, b) end
  if op == 'in' then return self:contains(b, a) end
  if op == 'notin' then return not self:contains(b, a) end
  local ok, r = pcall(function()
    if op == '<' then return values.lt(a, b) end
    if op == '>' then return values.lt(b, a) end
    if op == '<=' then return values.lt(a, b) or values.eq(a, b) end
    if op == '>=' then return values.lt(b, a) or values.eq(a, b) end
  end)
  if not ok then rt_error(self, tostring(r)) end
  return r
end

------------------------------------------------------------------------------
-- calls

function Interp:call(fn, args, kwargs)
  local k = kind(fn)
  if k == 'undefined' then undefined_error(self, fn) end
  if k ~= 'callable' then rt_error(self, ("'%s' object is not callable"):format(k)) end
  return fn.fn(args, kwargs, self)
end

function Interp:eval_args(node)
  local args = { n = #node.args }
  for i, a in ipairs(node.args) do args[i] = self:eval(a) end
  local kwargs = {}
  for _, kv in ipairs(node.kwargs) do kwargs[kv[1]] = self:eval(kv[2]) end
  return args, kwargs
end

------------------------------------------------------------------------------
-- expressions

function Interp:eval(node)
  local k = node.k
  if node.line then self.line = node.line end
  if k == 'const' then return node.v
  elseif k == 'name' then
    local v = lookup(self.scope, node.n)
    if v == nil then return values.undef(node.n) end
    return v
  elseif k == 'getattr' then
    return self:getattr(self:eval(node.obj), node.attr)
  elseif k == 'getitem' then
    local obj = self:eval(node.obj)
    return self:getitem(obj, self:eval(node.key))
  elseif k == 'slice' then
    local obj = self:eval(node.obj)
    local a = node.start and self:eval(node.start)
    local b = node.stop and self:eval(node.stop)
    local c = node.step and self:eval(node.step)
    if node.line then self.line = node.line end
    return self:slice(obj, a, b, c)
  elseif k == 'filter' then
    local v = self:eval(node.e)
    local args, kwargs = self:eval_args(node)
    self.line = node.line
    return filters.filters[node.name](self, v, args, kwargs)
  elseif k == 'test' then
    local v = self:eval(node.e)
    local args, kwargs = self:eval_args(node)
    self.line = node.line
    local r = filters.tests[node.name](self, v, args, kwargs)
    if node.negate then return not r end
    return r
  elseif k == 'call' then
    local fn = self:eval(node.fn)
    local args, kwargs = self:eval_args(node)
    self.line = node.line
    return self:call(fn, args, kwargs)
  elseif k == 'bin' then
    local a = self:eval(node.a)
    local b = self:eval(node.b)
    self.line = node.line
    return arith(self, node.op, a, b)
  elseif k == 'unary' then
    local v = self:eval(node.e)
    local kv = kind(v)
    if kv == 'int' then return node.op == '-' and -v or v end
    if kv == 'float' then return node.op == '-' and values.float(-v.v) or v end
    if kv == 'bool' then local x = v and 1 or 0; return node.op == '-' and -x or x end
    if kv == 'undefined' then undefined_error(self, v) end
    rt_error(self, ("bad operand type for unary %s: '%s'"):format(node.op, kv))
  elseif k == 'not' then
    return not truthy(self:eval(node.e))
  elseif k == 'and' then
    local a = self:eval(node.a)
    if not truthy(a) then return a end
    return self:eval(node.b)
  elseif k == 'or' then
    local a = self:eval(node.a)
    if truthy(a) then return a end
    return self:eval(node.b)
  elseif k == 'cond' then
    if truthy(self:eval(node.test)) then return self:eval(node.a) end
    if node.b then return self:eval(node.b) end
    return values.undef(nil, 'the inline if-expression on line ' .. tostring(node.line) ..
      ' evaluated to false and no else section was defined.')
  elseif k == 'compare' then
    local a = self:eval(node.first)
    for _, o in ipairs(node.ops) do
      local b = self:eval(o.e)
      self.line = o.line
      if not compare(self, o.op, a, b) then return false end
      a = b
    end
    return true
  elseif k == 'concat' then
    local parts = {}
    for i, e in ipairs(node.items) do parts[i] = str(self:eval(e)) end
    return table.concat(parts)
  elseif k == 'list' then
    local out = { n = #node.items }
    for i, e in ipairs(node.items) do out[i] = self:eval(e) end
    return values.list(out)
  elseif k == 'tuple' then
    local out = { n = #node.items }
    for i, e in ipairs(node.items) do out[i] = self:eval(e) end
    return values.tuple(out)
  elseif k == 'dict' then
    local d = values.dict()
    for _, p in ipairs(node.pairs) do
      local key = self:eval(p[1])
      local kk = kind(key)
      if kk ~= 'str' and kk ~= 'int' then rt_error(self, 'only str and int dict keys are supported') end
      values.dict_set(d, key, self:eval(p[2]))
    end
    return d
  end
  error('chat template evaluator: unknown expression node ' .. tostring(k))
end

------------------------------------------------------------------------------
-- output

function Interp:emit(s)
  if s == '' then return end
  local buf = self.buf
  buf[#buf + 1] = s
  if buf == self.top then self.top_len = self.top_len + #s end
end

-- Runs `body` into a fresh buffer and returns its text.
function Interp:capture(body)
  local saved = self.buf
  self.buf = {}
  local signal = self:exec_body(body)
  local text = table.concat(self.buf)
  self.buf = saved
  return text, signal
end

------------------------------------------------------------------------------
-- statements

local function assign(self, target, v, scope)
  scope = scope or self.scope
  if target.k == 'name' then
    scope.vars[target.n] = v
  elseif target.k == 'tuple' then
    local items = self:iterate(v)
    if items.n ~= #target.names then
      rt_error(self, ('cannot unpack %d values into %d names'):format(items.n, #target.names), target.line)
    end
    for i, n in ipairs(target.names) do scope.vars[n] = items[i] end
  elseif target.k == 'nsattr' then
    local ns = lookup(self.scope, target.n)
    if kind(ns) ~= 'namespace' then
      rt_error(self, "can't assign attribute on non-namespace object", target.line)
    end
    if target.attr:sub(1, 1) == '_' then
      rt_error(self, ("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.")
        :format(target.attr), target.line)
    end
    values.dict_set(ns, target.attr, v)
  end
end

local function loop_object(items, index, depth)
  local n = items.n
  local obj = { __kind = 'loop' }
  function obj.get(self, attr)
    if attr == 'index' then return index end
    if attr == 'index0' then return index - 1 end
    if attr == 'revindex' then return n - index + 1 end
    if attr == 'revindex0' then return n - index end
    if attr == 'first' then return index == 1 end
    if attr == 'last' then return index == n end
    if attr == 'length' then return n end
    if attr == 'depth' then return depth end
    if attr == 'depth0' then return depth - 1 end
    if attr == 'previtem' then
      if index > 1 then return items[index - 1] end
      return values.undef(nil, 'there is no previous item')
    end
    if attr == 'nextitem' then
      if index < n then return items[index + 1] end
      return values.undef(nil, 'there is no next item')
    end
    if attr == 'cycle' then
      return values.callable(function(args)
        if args.n == 0 then error('no items for cycling given', 0) end
        return args[(index - 1) % args.n + 1]
      end, 'cycle')
    end
    return values.undef(nil, ("'LoopContext' object has no attribute '%s'"):format(attr))
  end
  return obj
end

function Interp:exec_for(node)
  local iterable = self:eval(node.iter)
  self.line = node.line
  local all = self:iterate(iterable)
  local items = all
  local outer = self.scope
  if node.cond then
    items = { n = 0 }
    for i = 1, all.n do
      local s = new_scope(outer)
      self.scope = s
      assign(self, node.target, all[i], s)
      if truthy(self:eval(node.cond)) then items.n = items.n + 1; items[items.n] = all[i] end
    end
    self.scope = outer
  end
  local outer_loop = lookup(outer, 'loop')
  local depth = 1
  if outer_loop and kind(outer_loop) == 'loop' then depth = outer_loop:get('depth') + 1 end
  for i = 1, items.n do
    local s = new_scope(outer)
    self.scope = s
    assign(self, node.target, items[i], s)
    s.vars.loop = loop_object(items, i, depth)
    local signal = self:exec_body(node.body)
    self.scope = outer
    if signal == 'break' then break end
  end
  self.scope = outer
  if items.n == 0 and node.else_ then
    return self:exec_body(node.else_)
  end
end

function Interp:define_macro(node)
  local def_scope = self.scope
  local interp = self
  local fn = function(args, kwargs)
    local s = new_scope(def_scope)
    local nparams = #node.params
    if args.n > nparams then
      rt_error(interp, ('macro %s takes not more than %d argument(s)'):format(node.name, nparams))
    end
    local known = {}
    for i, p in ipairs(node.params) do
      known[p[1]] = true
      local v
      if i <= args.n then v = args[i]
      elseif kwargs[p[1]] ~= nil then v = kwargs[p[1]]
      end
      if i <= args.n and kwargs[p[1]] ~= nil then
        rt_error(interp, ("macro %s got multiple values for argument '%s'"):format(node.name, p[1]))
      end
      s.vars[p[1]] = v
    end
    for name in pairs(kwargs) do
      if not known[name] then rt_error(interp, ("macro %s takes no keyword argument '%s'"):format(node.name, name)) end
    end
    local saved_scope, saved_line = interp.scope, interp.line
    interp.scope = s
    -- defaults are evaluated in the macro's scope, left to right, so a
    -- default may read an earlier parameter
    for _, p in ipairs(node.params) do
      if s.vars[p[1]] == nil then
        if p[2] then s.vars[p[1]] = interp:eval(p[2])
        else s.vars[p[1]] = values.undef(p[1], ("parameter '%s' was not provided"):format(p[1])) end
      end
    end
    local text = interp:capture(node.body)
    interp.scope, interp.line = saved_scope, saved_line
    return text
  end
  self.scope.vars[node.name] = values.callable(fn, node.name)
end

function Interp:exec(node)
  local k = node.k
  if node.line then self.line = node.line end
  if k == 'data' then
    self:emit(node.v)
  elseif k == 'output' then
    local v = self:eval(node.e)
    self:emit(str(v))
  elseif k == 'if' then
    for _, t in ipairs(node.tests) do
      if truthy(self:eval(t[1])) then return self:exec_body(t[2]) end
    end
    if node.else_ then return self:exec_body(node.else_) end
  elseif k == 'for' then
    return self:exec_for(node)
  elseif k == 'set' then
    local v = self:eval(node.e)
    assign(self, node.target, v)
  elseif k == 'setblock' then
    local text = self:capture(node.body)
    local v = text
    for _, f in ipairs(node.filters) do
      local args, kwargs = self:eval_args(f)
      v = filters.filters[f.name](self, v, args, kwargs)
    end
    assign(self, node.target, v)
  elseif k == 'macro' then
    self:define_macro(node)
  elseif k == 'with' then
    local outer = self.scope
    local s = new_scope(outer)
    for _, a in ipairs(node.assigns) do s.vars[a[1]] = self:eval(a[2]) end
    self.scope = s
    local signal = self:exec_body(node.body)
    self.scope = outer
    return signal
  elseif k == 'filterblock' then
    local v, signal = self:capture(node.body)
    for _, f in ipairs(node.filters) do
      local args, kwargs = self:eval_args(f)
      v = filters.filters[f.name](self, v, args, kwargs)
    end
    self:emit(str(v))
    return signal
  elseif k == 'break' or k == 'continue' then
    return k
  elseif k == 'generation' then
    local text, signal = self:capture(node.body)
    local start = self.top_len
    self.spans[#self.spans + 1] = { start, start + #text }
    self:emit(text)
    return signal
  else
    error('chat template evaluator: unknown statement node ' .. tostring(k))
  end
end

function Interp:exec_body(body)
  for _, node in ipairs(body) do
    local signal = self:exec(node)
    if signal then return signal end
  end
end

-- Renders `tree` with `globals` (name -> value) and `context` (name ->
-- value, the caller's variables). Returns the text and the generation
-- spans ({start, stop} 0-based byte offsets, stop exclusive), or raises a
-- {template_error=true, line=, msg=} table.
function M.run(tree, globals, context)
  local g = new_scope(nil)
  for k, v in pairs(globals) do g.vars[k] = v end
  local root = new_scope(g)
  for k, v in pairs(context) do root.vars[k] = v end
  local top = {}
  local self = setmetatable({ scope = root, buf = top, top = top, top_len = 0, spans = {}, line = 1 }, Interp)
  self:exec_body(tree)
  return table.concat(top), self.spans
end

return M
