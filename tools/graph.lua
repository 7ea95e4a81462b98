-- tools/graph.lua: what the tools that check the core's layering share
-- (tools/layers.lua: calls between files; tools/includes.lua: includes
-- between folders): the circles of a dependency graph, and the lines a
-- command prints.
--
--   local graph = require 'tools.graph'      (tools run from the repository root)
--   for _, circle in ipairs(graph.sccs(nodes, succ)) do ... end
package.path = './lua/?.lua;' .. package.path -- fsdp.quote needs nothing else
local quote = require 'fsdp.quote'

local M = {}

-- The lines a command (a list of words) prints; its errors are dropped
-- (a missing object directory lists nothing).
function M.lines(words)
  local f = assert(io.popen(quote.command(words) .. ' 2>/dev/null'))
  local out = {}
  for l in f:lines() do out[#out + 1] = l end
  f:close()
  return out
end

-- The strongly connected components of more than one node (Tarjan), each
-- sorted, of the graph whose nodes are `nodes` (a list) and whose edges
-- leave v towards the keys of succ(v) (a set). Nodes and successors are
-- visited in sorted order, so the result does not depend on hashing.
function M.sccs(nodes, succ)
  local index, low, on, stack, out, n = {}, {}, {}, {}, {}, 0
  local function visit(v)
    n = n + 1; index[v] = n; low[v] = n
    stack[#stack + 1] = v; on[v] = true
    local ws = {}
    for w in pairs(succ(v)) do ws[#ws + 1] = w end
    table.sort(ws)
    for _, w in ipairs(ws) do
      if not index[w] then visit(w); low[v] = math.min(low[v], low[w])
      elseif on[w] then low[v] = math.min(low[v], index[w]) end
    end
    if low[v] == index[v] then
      local comp = {}
      repeat
        local w = table.remove(stack); on[w] = nil; comp[#comp + 1] = w
      until w == v
      if #comp > 1 then table.sort(comp); out[#out + 1] = comp end
    end
  end
  local sorted = {}
  for i, v in ipairs(nodes) do sorted[i] = v end
  table.sort(sorted)
  for _, v in ipairs(sorted) do if not index[v] then visit(v) end end
  return out
end

return M
