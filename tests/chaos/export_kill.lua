-- tests/chaos/export_kill.lua: tools/export.lua killed with SIGKILL at
-- random moments, into fresh and existing directories, and every directory
-- left behind judged.
--
--   fsdp-lua tests/chaos/export_kill.lua [KILLS]      (default 24 random kills)
--   FSDP_CHAOS_SEED=N fsdp-lua tests/chaos/export_kill.lua   replay the draws
--
-- Two models of the same shapes, A and B, are full state dicts; their
-- exports have the same file names (one config, the same numbered weight
-- files, one index), so a directory that mixes them loads without any
-- name or shape error: what issue 38 found ("shards of two models plus
-- the old config and index, which load and generate with exit 0"). Each
-- try exports B into a directory that is missing, empty (as a recipe's
-- option check leaves --export_hf), or holds the export of A, and kills
-- the export a random 0..1.1x of an uninterrupted export's time after it
-- starts (or 0..0.6x after its first write), until KILLS tries were killed
-- before the export finished. Then, for the directory and every entry
-- beside it that the export left (.NAME.*), the verdict must be one of:
--   A or B     it loads, and every tensor equals that export's, bit for bit;
--   refused    loading fails with one line that names it;
-- and never `mixed` (some tensors of each) or a load of anything else. A
-- directory that held A must still hold A or hold B, or be refused with a
-- message naming where A was moved, whole (nothing saved is lost). After
-- each try the export runs again to the end: the directory then holds B
-- and nothing of the killed export is left beside it. Besides the random
-- kills, the test hook of fsdp.io.publish kills the export at each step of
-- its commit (moments too short for a random kill to find), on the
-- exchange path and on the two-rename one.
--
-- Prints one "# " line per try, "ok"/"not ok" lines and a summary of the
-- verdicts; exits 1 on any problem. Bounded: about 1 s a try here.
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'
local files = require 'fsdp.io.files'
local hf = require 'models.hf'
local llama = require 'models.llama'
local host = require 'fsdp.host'

local TRIES = tonumber(arg and arg[1]) or 24 -- random kills wanted
local SEED = tonumber(os.getenv('FSDP_CHAOS_SEED') or '') or os.time()
math.randomseed(SEED)
print(('# seed %d (FSDP_CHAOS_SEED=%d replays the draws), %d tries'):format(SEED, SEED, TRIES))

local problems = 0
local function problem(fmt, ...)
  problems = problems + 1
  print('not ok - ' .. fmt:format(...))
end

local work = T.tmpdir()
local q = T.quote

-- The models: large enough that writing takes a visible share of an
-- export (about 10 weight files), small enough for a second a try.
local function model(seed)
  local m = llama.build('tiny', { dim = 128, n_layers = 4, ffn_dim = 352, vocab_size = 1024 })
  m:init_weights({ seed = seed })
  return m
end
for name, seed in pairs({ A = 1, B = 2 }) do
  fsdp.checkpointing.save_full_state_dict(('%s/%s.safetensors'):format(work, name), model(seed))
end

local function export_cmd(name, dir)
  return ('%s tools/export.lua %s %s --model=tiny --max_shard_size=400KB'):format(q(host.exe),
    q(('%s/%s.safetensors'):format(work, name)), q(dir))
end

local clock = require 'fsdp.clock'
local function export(name, dir)
  local t0 = clock.now()
  local out, rc = T.sh(export_cmd(name, dir))
  if rc ~= 0 then error(('export of %s into %s failed (%d): %s'):format(name, dir, rc, out), 0) end
  return clock.now() - t0
end

-- The reference exports, and the time of an uninterrupted one: the
-- shortest of three, so that one slowed by other load does not put every
-- kill after the end.
export('A', work .. '/refA')
local full = math.huge
for _ = 1, 3 do full = math.min(full, export('B', work .. '/refB')) end
local function params(dir)
  local out = {}
  for _, p in ipairs(hf.from_pretrained(dir):named_parameters()) do out[p[1]] = p[2] end
  return out
end
local ref = { A = params(work .. '/refA'), B = params(work .. '/refB') }
local nweights = 0
for _, n in ipairs(files.list(work .. '/refB')) do
  if n:match('^model%-%d+%-of%-%d+%.safetensors$') then nweights = nweights + 1 end
end
print(('# an uninterrupted export takes %.2f s and writes %d weight files'):format(full, nweights))

-- Bit for bit, in the tensors' own dtype (no f64 copies: a try must stay
-- short).
local function equal(a, b)
  return table.concat(a.shape, ',') == table.concat(b.shape, ',') and a.dtype == b.dtype
    and fsdp.F.max((a - b):abs():view(-1), 0):item() == 0
end

-- What loading path gives: 'A', 'B', 'refused', or 'mixed' / 'other' (a
-- problem), and the message.
local function verdict(path)
  local ok, got = pcall(params, path)
  if not ok then
    local msg = tostring(got)
    local base = path:match('[^/]+$')
    if msg:find('\n', 1, true) then return 'refused-badly', 'more than one line: ' .. msg end
    if not msg:find(base, 1, true) then return 'refused-badly', 'does not name ' .. base .. ': ' .. msg end
    return 'refused', msg
  end
  local same = { A = 0, B = 0 }
  local n = 0
  for name, t in pairs(got) do
    n = n + 1
    for k, r in pairs(ref) do
      if r[name] and equal(t, r[name]) then same[k] = same[k] + 1 end
    end
  end
  for k, c in pairs(same) do
    if c == n then return k, '' end
  end
  if same.A > 0 and same.B > 0 then return 'mixed', ('%d tensors of A, %d of B'):format(same.A, same.B) end
  return 'other', ('%d tensors, none of one export'):format(n)
end

local tally = {}
local function count(key) tally[key] = (tally[key] or 0) + 1 end
local killed = 0

-- One try: B exported into a directory of `kind` ('missing', 'empty',
-- 'existing': holding A), ended by a kill (`how`: {trigger =, delay =} for
-- a random one, {point =} for the test hook of fsdp.io.publish), judged,
-- then exported again to the end.
local function try(label, kind, how, env)
  local parent = ('%s/%s'):format(work, label)
  files.mkdir_p(parent)
  local dir = parent .. '/out'
  if kind == 'empty' then files.mkdir_p(dir) end
  if kind == 'existing' then assert(os.execute(('cp -a %s %s'):format(q(work .. '/refA'), q(dir))) == 0) end
  local cmd, when
  if how.point then
    when = 'at ' .. how.point
    cmd = ('FSDP_TEST_KILL_IN_PUBLISH=%s %s %s >%s 2>&1; echo "export-rc=$?"'):format(how.point, env,
      export_cmd('B', dir), q(parent .. '.log'))
  else
    when = ('%.3f s after it %s'):format(how.delay, how.trigger)
    -- 'written' waits for the export's first entry under the parent (it
    -- has started writing) before its delay, so kills land while files
    -- are written however long the start takes on a loaded machine.
    local wait = how.trigger == 'written' and ('n=$(find %s | wc -l); while kill -0 $p 2>/dev/null && '
      .. '[ "$(find %s | wc -l)" -eq "$n" ]; do sleep 0.002; done; '):format(q(parent), q(parent)) or ''
    -- The export is the shell's direct child ($!), so the kill reaches it
    -- and nothing else.
    cmd = ('%s %s >%s 2>&1 & p=$!; %ssleep %.3f; kill -9 $p 2>/dev/null; wait $p; echo "export-rc=$?"')
      :format(env, export_cmd('B', dir), q(parent .. '.log'), wait, how.delay)
  end
  local rc = tonumber(T.sh(cmd):match('export%-rc=(%d+)'))
  if rc == 137 then killed = killed + 1 end
  local function bad(fmt, ...) problem('%s (%s, killed %s): ' .. fmt, label, kind, when, ...) end
  local seen, out_v, out_msg = {}, nil, nil
  local names = files.list(parent)
  if not files.lmode(dir) then table.insert(names, 1, 'out') end -- a missing directory is judged too
  for _, name in ipairs(names) do
    local path = parent .. '/' .. name
    local v, msg = verdict(path)
    seen[#seen + 1] = ('%s=%s'):format(name, v)
    if name == 'out' then out_v, out_msg = v, msg end
    count(('%s %s'):format(name == 'out' and 'the directory' or 'beside it', v))
    if v ~= 'A' and v ~= 'B' and v ~= 'refused' then bad('%s loads as %s: %s', path, v, msg) end
    if name == 'out' and rc == 0 and v ~= 'B' then
      bad('the export finished (exit 0) but %s is %s: %s', path, v, msg)
    end
    if name ~= 'out' and not name:match('^%.out%.') then bad('it left %s, not named after %s', path, dir) end
  end
  -- Nothing saved is lost: a directory that held A holds A or B, or its
  -- refusal names where A was moved, and A is whole there (restored as
  -- the message says, into a copy).
  if kind == 'existing' and out_v ~= 'A' and out_v ~= 'B' then
    local aside = out_msg and out_msg:match('`mv (%S+) ')
    local v = 'nowhere'
    if aside then
      assert(os.execute(('cp -a %s %s'):format(q(aside), q(parent .. '.restored'))) == 0)
      v = verdict(parent .. '.restored')
      files.remove_tree(parent .. '.restored')
    end
    count('restored as the refusal says ' .. v)
    if v ~= 'A' then bad('the export of A in %s is lost: %s, and what its refusal names is %s', dir, out_msg, v) end
  end
  print(('# %s: %-8s killed %s (exit %s): %s'):format(label, kind, when, tostring(rc), table.concat(seen, ' ')))
  -- Recovery: the export run again to the end replaces whatever is there
  -- and leaves nothing of the killed one.
  local ok, err = pcall(export, 'B', dir)
  if not ok then
    bad('exporting again failed: %s', err)
  else
    local v, msg = verdict(dir)
    if v ~= 'B' then bad('after exporting again %s is %s: %s', dir, v, msg) end
    local left = files.list(parent)
    if #left ~= 1 then bad('exporting again left %s', table.concat(left, ' ')) end
  end
  files.remove_tree(parent)
  return rc
end

-- Random kills: fresh and existing directories in turn, half of them
-- triggered by the first write, a quarter on the two-rename path. Tries
-- go on until TRIES were killed before the export finished (at most twice
-- as many): an export that finished first is judged too, and makes the
-- delays shorter, since the machine's load changes how long one takes.
local KINDS = { 'missing', 'empty', 'existing' }
local random_killed, attempts, scale = 0, 0, 1
while random_killed < TRIES and attempts < 2 * TRIES do
  attempts = attempts + 1
  local i = attempts
  local trigger = i % 2 == 0 and 'written' or 'started'
  local how = { trigger = trigger, delay = math.random() * full * scale * (trigger == 'written' and 0.6 or 1.1) }
  local env = i % 4 == 0 and 'FSDP_TEST_NO_EXCHANGE=1' or ''
  local rc = try(('random%02d%s'):format(i, env ~= '' and '-renames' or ''), KINDS[(i - 1) % #KINDS + 1], how, env)
  if rc == 137 then random_killed = random_killed + 1 else scale = scale * 0.7 end
end
-- The moments too short for a random kill to find: each step of a
-- commit over an existing export, on both paths.
local POINTS = { { 'complete', '' }, { 'swapped', '' }, { 'discarding', '' }, { 'aside', 'FSDP_TEST_NO_EXCHANGE=1' },
                 { 'swapped', 'FSDP_TEST_NO_EXCHANGE=1' } }
for i, p in ipairs(POINTS) do
  local rc = try(('point%d-%s%s'):format(i, p[1], p[2] ~= '' and '-renames' or ''), 'existing', { point = p[1] }, p[2])
  if rc ~= 137 then problem('the kill at %s did not happen (exit %s)', p[1], tostring(rc)) end
end

local keys = {}
for k in pairs(tally) do keys[#keys + 1] = k end
table.sort(keys)
local parts = {}
for _, k in ipairs(keys) do parts[#parts + 1] = ('%s %d'):format(k, tally[k]) end
print(('# %d random tries, %d killed before the export finished; %d kills at the steps of a commit; '
  .. 'verdicts: %s'):format(attempts, random_killed, #POINTS, table.concat(parts, ', ')))
if random_killed < TRIES then
  problem('only %d of %d tries were killed before the export finished', random_killed, attempts)
end
if problems == 0 then
  print(('ok - %d exports killed (%d at random): every directory left loads as a whole export or is refused by '
    .. 'name, and exporting again recovers'):format(killed, random_killed))
  files.remove_tree(work)
else
  print(('# %d problems; work directory kept: %s'):format(problems, work))
  os.exit(1)
end
