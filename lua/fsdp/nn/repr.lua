-- fsdp.nn.repr: the pieces of PyTorch's module repr that layers need, so
-- `print(model)` reads exactly as it does in PyTorch: Python's float repr
-- (1e-05, 0.1, 4096.0), tuples ((3, 3), (4096,)), booleans (True/False),
-- and the indentation of nested reprs (torch.nn.modules.module._addindent).
local M = {}

-- Python's repr of a float: the shortest digits that read back as the same
-- double, positional for decimal exponents -4 ... 15 and scientific with at
-- least two exponent digits otherwise.
function M.float(x)
  if x ~= x then return 'nan' end
  if x == math.huge then return 'inf' end
  if x == -math.huge then return '-inf' end
  if x == 0 then return 1 / x < 0 and '-0.0' or '0.0' end
  local s
  for precision = 0, 16 do
    s = ('%.' .. precision .. 'e'):format(x)
    if tonumber(s) == x then break end
  end
  local sign, lead, rest, exp = s:match('^(-?)(%d)%.?(%d*)e([-+]%d+)$')
  exp = tonumber(exp)
  local digits = (lead .. rest):gsub('0+$', '')
  if digits == '' then digits = '0' end
  if exp < -4 or exp >= 16 then
    local mantissa = digits:sub(1, 1)
    if #digits > 1 then mantissa = mantissa .. '.' .. digits:sub(2) end
    return ('%s%se%s%02d'):format(sign, mantissa, exp < 0 and '-' or '+', math.abs(exp))
  end
  if exp < 0 then
    return sign .. '0.' .. ('0'):rep(-exp - 1) .. digits
  end
  if #digits <= exp + 1 then
    return sign .. digits .. ('0'):rep(exp + 1 - #digits) .. '.0'
  end
  return sign .. digits:sub(1, exp + 1) .. '.' .. digits:sub(exp + 2)
end

-- A number as Python prints it: integers without a fraction, floats by
-- M.float. `as_float` forces the float form (eps=1e-05, p=0.5, 1.0).
function M.number(x, as_float)
  if not as_float and x == math.floor(x) and math.abs(x) < 2^53 then
    return ('%d'):format(x)
  end
  return M.float(x)
end

function M.bool(b)
  return b and 'True' or 'False'
end

-- A Lua array of integers as a Python tuple: (3, 3), (4096,), ().
function M.tuple(t)
  local parts = {}
  for i = 1, #t do parts[i] = M.number(t[i]) end
  if #parts == 1 then return '(' .. parts[1] .. ',)' end
  return '(' .. table.concat(parts, ', ') .. ')'
end

-- A string as Python's repr of a str (single quotes).
function M.str(s)
  return "'" .. s:gsub('\\', '\\\\'):gsub("'", "\\'") .. "'"
end

-- Indent every line but the first by n spaces.
function M.addindent(s, n)
  if not s:find('\n', 1, true) then return s end
  local pad = (' '):rep(n)
  return (s:gsub('\n', '\n' .. pad))
end

return M
