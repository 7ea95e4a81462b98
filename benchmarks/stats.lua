-- benchmarks/stats.lua: what the benchmark scripts share to summarise
-- repeated measurements (require 'benchmarks.stats', the repository root
-- being on the host's path).
local M = {}

-- The median of a list of numbers (sorted in place).
function M.median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

return M
