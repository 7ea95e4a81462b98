-- fsdp.suggest: "did you mean ...?" for a misspelt name (an option, an
-- enum value, a model config key) among the valid ones.
--
--   local suggest = require 'fsdp.suggest'
--   suggest.closest('num_layer', {'num_layers', 'num_heads'})   -- 'num_layers'
--   suggest.closest('FULL', {'FULL_SHARD', 'NO_SHARD'})         -- 'FULL_SHARD' (a unique prefix)
--   suggest.hint('f8', {'f32', 'bf16'})                         -- " (did you mean f32?)" or ''
--
-- A candidate is suggested when it differs from the name only in case
-- or punctuation (llama2-7b: Llama-2-7b), when the name is, ignoring
-- case, a unique prefix
-- of it, or else when its edit distance (case-insensitive, see M.distance) is
-- the smallest and small for the name's length: at most 1 for names of up
-- to 4 characters, 2 up to 8, then a third of the length; of equal
-- distances, the one nearest without punctuation. A far-off name
-- gets no suggestion rather than a misleading one.
local M = {}

-- Edit distance of two strings: insertions, deletions, substitutions and
-- swaps of two neighbours (the commonest typo, "bf61") cost 1 (optimal
-- string alignment), three rows of the table at a time.
function M.distance(a, b)
  local n, m = #a, #b
  if n == 0 then return m end
  if m == 0 then return n end
  local before, prev, cur = {}, {}, {}
  for j = 0, m do prev[j] = j end
  for i = 1, n do
    cur[0] = i
    local ai = a:byte(i)
    for j = 1, m do
      local bj = b:byte(j)
      local d = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ai == bj and 0 or 1))
      if i > 1 and j > 1 and ai == b:byte(j - 1) and a:byte(i - 1) == bj then
        d = math.min(d, before[j - 2] + 1)
      end
      cur[j] = d
    end
    before, prev, cur = prev, cur, before
  end
  return prev[m]
end

local function allowed(len)
  if len <= 4 then return 1 end
  if len <= 8 then return 2 end
  return math.floor(len / 3)
end

-- A name in lower case without punctuation.
local function squeeze(s) return (s:lower():gsub('[%p%s]', '')) end

-- The candidate `name` most likely meant, or nil. candidates: a list of
-- strings (other values are skipped).
function M.closest(name, candidates)
  name = tostring(name)
  local lower = name:lower()
  if lower == '' then return nil end
  for _, c in ipairs(candidates) do
    if type(c) == 'string' and c ~= name and c:lower() == lower then return c end
  end
  local prefixed
  for _, c in ipairs(candidates) do
    if type(c) == 'string' and c:lower():sub(1, #lower) == lower and c:lower() ~= lower then
      if prefixed then prefixed = false break end
      prefixed = c
    end
  end
  if prefixed then return prefixed end
  -- Spelt the same but for punctuation (llama2-7b for Llama-2-7b): that one.
  local bare = squeeze(name)
  for _, c in ipairs(candidates) do
    if type(c) == 'string' and c ~= name and bare ~= '' and squeeze(c) == bare then return c end
  end
  -- Ties of the distance go to the candidate nearest without punctuation:
  -- llama3-8b is 3 edits from both Llama-2-7b and Llama-3.1-8B, but 1
  -- from llama318b and 2 from llama27b (the family and generation win).
  local best, best_d, best_bare
  for _, c in ipairs(candidates) do
    if type(c) == 'string' then
      local d = M.distance(lower, c:lower())
      if d > 0 and d <= allowed(#name) then
        local b = M.distance(bare, squeeze(c))
        if not best_d or d < best_d or (d == best_d and b < best_bare) then best, best_d, best_bare = c, d, b end
      end
    end
  end
  return best
end

-- " (did you mean X?)" with X as `format` writes it (default: as is), or
-- '' when nothing is close.
function M.hint(name, candidates, format)
  local c = M.closest(name, candidates)
  if not c then return '' end
  return (' (did you mean %s?)'):format(format and format(c) or c)
end

return M
