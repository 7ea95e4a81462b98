-- tests/data/corpus.lua: a small synthetic English-like corpus for the data
-- specs, generated (deterministically, from a seed) rather than copied:
-- sentences from a toy grammar whose words depend on each other (each
-- subject has its own verbs and objects), so a language model has
-- something to learn and its validation loss falls within a few dozen steps.
--
--   local corpus = require 'tests.data.corpus'
--   corpus.write('/tmp/c.txt', { documents = 200, seed = 1 })          -- paragraphs
--   corpus.write('/tmp/c.jsonl', { documents = 200, jsonl = true })    -- {"text": ...} lines
--   corpus.write_c4('/tmp/c4/en', { shards = 4, documents = 50 })        -- C4-like .json.gz shards
--   corpus.write_c4('/tmp/c4/en', { shards = 1, split = 'validation' })  -- c4-validation.00000-of-00001.json.gz
local M = {}

local subjects = {
  { 'the cat', { 'chases', 'watches', 'ignores' }, { 'the mouse', 'a bird', 'the red ball' } },
  { 'my brother', { 'reads', 'writes', 'sells' }, { 'old books', 'long letters', 'a newspaper' } },
  { 'the farmer', { 'plants', 'waters', 'harvests' }, { 'the wheat', 'green beans', 'tall corn' } },
  { 'a sailor', { 'steers', 'repairs', 'paints' }, { 'the boat', 'a small ship', 'the old mast' } },
  { 'the teacher', { 'explains', 'grades', 'prepares' }, { 'the lesson', 'every test', 'a new course' } },
}
local endings = { ' every morning.', ' at night.', ' again.', ' with care.', '.' }

-- n sentences joined into a paragraph, from the generator `rand(k)` (1..k).
local function paragraph(rand, n)
  local out = {}
  for i = 1, n do
    local s = subjects[rand(#subjects)]
    out[i] = s[1]:gsub('^%l', string.upper) .. ' ' .. s[2][rand(3)] .. ' ' .. s[3][rand(3)] .. endings[rand(#endings)]
  end
  return table.concat(out, ' ')
end

-- The documents as a Lua array of strings.
function M.documents(opts)
  opts = opts or {}
  math.randomseed(opts.seed or 1)
  local docs = {}
  for i = 1, opts.documents or 200 do docs[i] = paragraph(math.random, math.random(2, 5)) end
  return docs
end

-- Write the corpus as a text file (paragraphs separated by blank lines) or
-- as JSONL ({"text": ...} per line, opts.field renames the field).
function M.write(path, opts)
  opts = opts or {}
  local docs = M.documents(opts)
  local f = assert(io.open(path, 'wb'))
  for _, d in ipairs(docs) do
    if opts.jsonl then
      f:write(('{"id": %d, "%s": "%s"}\n'):format(_, opts.field or 'text', d))
    else
      f:write(d, '\n\n')
    end
  end
  f:close()
  return docs
end

-- A C4-like directory: opts.shards files c4-train.0000K-of-0000N.json.gz
-- (compressed by the gzip command; opts.compress = 'zstd' writes .json.zst)
-- of opts.documents {"text", "timestamp", "url"} lines each, as C4's
-- en split is laid out. Returns the documents of every shard, in order.
function M.write_c4(dir, opts)
  opts = opts or {}
  local n = opts.shards or 4
  assert(os.execute(('mkdir -p %q'):format(dir)) == 0)
  local all = {}
  for k = 0, n - 1 do
    local docs = M.documents({ documents = opts.documents or 50, seed = (opts.seed or 1) * 1000 + k })
    local path = ('%s/c4-%s.%05d-of-%05d.json'):format(dir, opts.split or 'train', k, n)
    local f = assert(io.open(path, 'wb'))
    for i, d in ipairs(docs) do
      f:write(('{"text":"%s","timestamp":"2019-04-%02dT12:00:00Z","url":"https://example.com/%d/%d"}\n'):format(
        d, 1 + i % 28, k, i))
      all[#all + 1] = d
    end
    f:close()
    local cmd = opts.compress == 'zstd' and ('zstd -q --rm -f %q -o %q.zst'):format(path, path)
      or ('gzip -f %q'):format(path)
    assert(os.execute(cmd) == 0, cmd)
  end
  return all
end

return M
