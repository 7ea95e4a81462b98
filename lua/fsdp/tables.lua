-- fsdp.tables: small helpers over plain Lua tables that many modules need,
-- written once here (it requires nothing, so any module may use it without
-- closing a circle in the require graph).
local M = {}

-- The keys of t in sorted order: t's keys all strings or all numbers, or,
-- with `cmp`, any keys it orders (M.by_string orders mixed keys).
function M.sorted_keys(t, cmp)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, cmp)
  return keys
end

-- An order for keys of mixed types (strings and numbers): by their text.
function M.by_string(a, b) return tostring(a) < tostring(b) end

return M
