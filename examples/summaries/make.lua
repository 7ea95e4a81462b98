-- examples/summaries/make.lua: writes the example dataset of the T5
-- fine-tuning command in docs/training.md (train.jsonl, val.jsonl next to this
-- file): short news-style sentences as sources and their one-line
-- summaries as targets, in the {"source": ..., "target": ...} JSONL that
-- recipes/t5_3b.lua --data reads. The pairs are generated from templates
-- and a seeded generator, not copied from anywhere, and the same every
-- time (tests/lua/t5_pairs_spec.lua checks the stored files are this
-- script's output):
--
--   fsdp-lua examples/summaries/make.lua [OUT_DIR]     (default: examples/summaries)
--
-- A summary keeps the facts of its source (a city, a day, a number) and
-- drops the wording around them, the way news headlines and the seed's
-- summarization data do, so a model must both copy spans of the source and
-- learn each template's rewrite.
local M = {}

local cities = { 'Oslo', 'Lima', 'Cairo', 'Quito', 'Perth', 'Dakar', 'Hanoi', 'Tunis', 'Riga', 'Porto', 'Lyon',
                 'Kyoto', 'Accra', 'Bergen', 'Cork', 'Graz' }
local days = { 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday', 'Sunday' }
local weather = { 'heavy rain', 'light snow', 'sunshine', 'thick fog', 'strong wind', 'thunderstorms' }
local items = { 'bikes', 'books', 'shoes', 'coffee', 'phones', 'lamps', 'tents', 'pianos' }
local shops = { 'largest store', 'old market', 'main bookshop', 'new mall', 'family shop' }
local topics = { 'budget', 'hiring', 'safety', 'design', 'travel', 'training' }
local teams = { 'Hawks', 'Lions', 'Otters', 'Comets', 'Wolves', 'Pilots', 'Rovers', 'Tigers' }
local causes = { 'snow', 'a signal fault', 'track repairs', 'a strike', 'flooding' }

-- A deterministic generator: Park-Miller's minimal standard (exact in
-- doubles), so the files are the same on every machine and Lua.
local function generator(seed)
  local x = seed % 2147483646 + 1
  return function(n)
    x = (x * 16807) % 2147483647
    return x % n + 1
  end
end

local templates = {
  function(r)
    local city, day, w, t = cities[r(#cities)], days[r(#days)], weather[r(#weather)], 5 + r(25)
    return ('Forecasters say %s will see %s on %s, with temperatures near %d degrees in the afternoon.')
             :format(city, w, day, t),
           ('%s, %s: %s, %dC'):format(city, day, w, t)
  end,
  function(r)
    local shop, city, item, n, up = shops[r(#shops)], cities[r(#cities)], items[r(#items)], r(40), r(2) == 1
    return ('The %s in %s reported that sales of %s %s by %d percent compared with last year.')
             :format(shop, city, item, up and 'rose' or 'fell', n),
           ('%s %s sales %s %d%%'):format(city, item, up and 'up' or 'down', n)
  end,
  function(r)
    local topic, d1, d2, h = topics[r(#topics)], days[r(#days)], days[r(#days)], 8 + r(9)
    return ('The %s meeting planned for %s has been moved to %s at %d o\'clock, the office said.')
             :format(topic, d1, d2, h),
           ('%s meeting moved to %s %d:00'):format(topic, d2, h)
  end,
  function(r)
    local a, b = r(#teams), r(#teams - 1)
    if b >= a then b = b + 1 end
    local y = r(3) - 1
    local x, day = y + r(4), days[r(#days)]
    return ('In a close game on %s, the %s beat the %s by %d to %d in front of a home crowd.')
             :format(day, teams[a], teams[b], x, y),
           ('%s %d-%d %s'):format(teams[a], x, y, teams[b])
  end,
  function(r)
    local a, b = r(#cities), r(#cities - 1)
    if b >= a then b = b + 1 end
    local n, day, cause = 5 * r(12), days[r(#days)], causes[r(#causes)]
    return ('Trains from %s to %s are running about %d minutes late on %s because of %s.')
             :format(cities[a], cities[b], n, day, cause),
           ('%s-%s trains %d min late (%s)'):format(cities[a], cities[b], n, cause)
  end,
}

-- n pairs {source, target} from the seed, templates taken in turn from a
-- random start so every template is equally common.
function M.pairs(n, seed)
  local r = generator(seed)
  local out = {}
  for i = 1, n do
    local s, t = templates[(i + seed) % #templates + 1](r)
    out[i] = { s, t }
  end
  return out
end

-- A JSON string of plain text (the templates use no control characters).
local function json_string(s)
  return '"' .. s:gsub('[\\"]', '\\%0') .. '"'
end

function M.write(path, list)
  local f = assert(io.open(path, 'wb'))
  for _, p in ipairs(list) do
    f:write(('{"source": %s, "target": %s}\n'):format(json_string(p[1]), json_string(p[2])))
  end
  f:close()
end

-- The two files: 400 training pairs and 48 validation pairs from another seed.
function M.make(dir)
  M.write(dir .. '/train.jsonl', M.pairs(400, 1))
  M.write(dir .. '/val.jsonl', M.pairs(48, 2))
end

-- Run as a script (not when required by a test).
if arg and arg[0] and arg[0]:match('make%.lua$') then
  M.make(arg[1] or 'examples/summaries')
end

return M
