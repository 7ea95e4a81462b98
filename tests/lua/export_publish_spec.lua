-- export_publish_spec.lua: exports are published whole (fsdp.io.publish,
-- [Note: exports are published whole]; issue 38). An export replaces its
-- directory in one step and only when the directory is missing, empty or
-- an earlier export of ours; loaders refuse, by name, an unfinished
-- export, one missing a file, one mixing files of two exports and the
-- leftovers of an interrupted one, while directories transformers wrote
-- load as before; the next export restores an old directory a crash left
-- moved aside and removes the rest; --export_hf and tools/export.lua
-- refuse, before any work, a directory the model comes from (naming both)
-- and a directory of the user's. Last, tests/chaos/export_kill.lua: the
-- export killed at random moments and at each step of its commit.
local fsdp = require 'fsdp'
local T = require 'fsdp.testing'
local hf = require 'models.hf'
local llama = require 'models.llama'
local lora = require 'fsdp.lora'
local files = require 'fsdp.io.files'
local json = require 'fsdp.io.json'
local publish = require 'fsdp.io.publish'
local pretrained = require 'models.pretrained'
local host = require 'fsdp.host'

local GOLDEN = 'tests/golden/hf/'
local q = T.quote

local function model(seed)
  local m = llama.build('tiny', { vocab_size = 64 })
  m:init_weights({ seed = seed })
  return m
end
local A, B = model(1), model(2)

-- Whether the parameters of a and b are equal, bit for bit.
local function same(a, b)
  local bp = {}
  for _, p in ipairs(b:named_parameters()) do bp[p[1]] = p[2] end
  for _, p in ipairs(a:named_parameters()) do
    if T.max_abs_diff(p[2], bp[p[1]]) ~= 0 then return false end
  end
  return true
end

local function manifest(dir) return json.decode(files.read(dir .. '/' .. publish.MANIFEST)) end

local function write(path, text)
  local f = assert(io.open(path, 'wb'))
  f:write(text)
  f:close()
end

describe('an export', function()
  it('replaces a missing, empty or earlier export directory whole, and leaves nothing beside it', function()
    local d = T.tmpdir()
    hf.save_pretrained(A, d .. '/out')
    assert.same({ 'config.json', 'fsdp_export.json', 'model.safetensors' }, files.list(d .. '/out'))
    local m = manifest(d .. '/out')
    assert.equals('complete', m.state)
    assert.same({ 'config.json', 'model.safetensors' }, m.files)
    -- Over it, in another layout: the directory is the new export alone.
    hf.save_pretrained(B, d .. '/out', { max_shard_size = '20KB' })
    local listed = files.list(d .. '/out')
    assert.equals(nil, files.mode(d .. '/out/model.safetensors'))
    assert.equals('model.safetensors.index.json', listed[#listed])
    assert.equals(#listed - 1, #manifest(d .. '/out').files)
    assert.is_true(same(hf.from_pretrained(d .. '/out'), B))
    assert.same({ 'out' }, files.list(d))
    files.mkdir_p(d .. '/empty')
    hf.save_pretrained(A, d .. '/empty/')
    assert.is_true(same(hf.from_pretrained(d .. '/empty'), A))
    -- Through a link: the directory it points to is replaced, the link stays.
    assert(os.execute(('ln -s out %s'):format(q(d .. '/link'))) == 0)
    hf.save_pretrained(A, d .. '/link')
    assert.equals('link', files.lmode(d .. '/link'))
    assert.is_true(same(hf.from_pretrained(d .. '/out'), A))
    assert.same({ 'empty', 'link', 'out' }, files.list(d))
    files.remove_tree(d)
  end)

  it('refuses a directory that is not ours to replace, naming it, and leaves it as it was', function()
    local d = T.tmpdir()
    files.mkdir_p(d .. '/mine')
    write(d .. '/mine/notes.txt', 'mine')
    T.raises(function() hf.save_pretrained(A, d .. '/mine') end,
      d .. '/mine is not empty (it holds notes.txt) and is not an export of fsdp-lua')
    assert.same({ 'notes.txt' }, files.list(d .. '/mine'))
    -- An export the user added a file to.
    hf.save_pretrained(A, d .. '/out')
    write(d .. '/out/README.md', 'about')
    T.raises(function() hf.save_pretrained(B, d .. '/out') end,
      d .. '/out is an export of fsdp-lua but also holds README.md, which the export did not write')
    assert.is_true(same(hf.from_pretrained(d .. '/out'), A))
    -- A directory transformers wrote, a file.
    assert(os.execute(('cp -r %s %s'):format(q(GOLDEN .. 'llama3_tiny_v5'), q(d .. '/theirs'))) == 0)
    T.raises(function() hf.save_pretrained(A, d .. '/theirs') end, 'is not an export of fsdp-lua')
    write(d .. '/file', 'x')
    T.raises(function() hf.save_pretrained(A, d .. '/file') end, d .. '/file exists and is not a directory')
    assert.same({ 'file', 'mine', 'out', 'theirs' }, files.list(d))
    files.remove_tree(d)
  end)

  it('swaps in the same way by two renames where the file system cannot exchange', function()
    local ffi = require 'ffi'
    pcall(ffi.cdef, 'int setenv(const char *, const char *, int); int unsetenv(const char *);')
    local d = T.tmpdir()
    hf.save_pretrained(A, d .. '/out')
    ffi.C.setenv('FSDP_TEST_NO_EXCHANGE', '1', 1)
    local ok, err = pcall(hf.save_pretrained, B, d .. '/out', { max_shard_size = '20KB' })
    ffi.C.unsetenv('FSDP_TEST_NO_EXCHANGE')
    assert(ok, err)
    assert.is_true(same(hf.from_pretrained(d .. '/out'), B))
    assert.same({ 'out' }, files.list(d))
    files.remove_tree(d)
  end)

  it('of PEFT adapters and of save_sharded is published whole too', function()
    local d = T.tmpdir()
    local m = model(3)
    lora.apply(m, { rank = 2, alpha = 4, targets = { 'q_proj', 'v_proj' } })
    lora.save_peft(m, d .. '/adapter')
    lora.save_peft(m, d .. '/adapter')
    assert.same({ 'adapter_config.json', 'adapter_model.safetensors', 'fsdp_export.json' }, files.list(d .. '/adapter'))
    assert.same({ 'adapter_model.safetensors' }, manifest(d .. '/adapter').tagged)
    files.mkdir_p(d .. '/mine')
    write(d .. '/mine/notes.txt', 'mine')
    T.raises(function() lora.save_peft(m, d .. '/mine') end, 'it holds notes.txt')
    T.raises(function() fsdp.save_safetensors_sharded(d .. '/mine', { w = fsdp.zeros({ 2 }) }) end,
      'it holds notes.txt')
    assert.same({ 'adapter', 'mine' }, files.list(d))
    files.remove_tree(d)
  end)
end)

describe('loading', function()
  -- Two exports of one layout (the same file names): A's and B's.
  local d = T.tmpdir()
  hf.save_pretrained(A, d .. '/a', { max_shard_size = '20KB' })
  hf.save_pretrained(B, d .. '/b', { max_shard_size = '20KB' })
  local function copy(from, to)
    assert(os.execute(('rm -rf %s && cp -a %s %s'):format(q(to), q(from), q(to))) == 0)
    return to
  end
  local shard = files.list(d .. '/a')[4]
  assert(shard:match('^model%-00002%-of%-'), shard)

  it('refuses an export that mixes the files of two, naming the directory and the file', function()
    local x = copy(d .. '/a', d .. '/x')
    assert(os.execute(('cp %s %s'):format(q(d .. '/b/' .. shard), q(x .. '/' .. shard))) == 0)
    local id = manifest(x).id
    for _, load in ipairs({ hf.from_pretrained, fsdp.load_safetensors_dir, pretrained.open }) do
      T.raises(function() load(x) end, x .. ' mixes files of two exports: ' .. shard .. ' is from export '
        .. manifest(d .. '/b').id .. ', its fsdp_export.json says ' .. id)
    end
    -- B's index beside A's shards.
    x = copy(d .. '/a', d .. '/x')
    assert(os.execute(('cp %s %s'):format(q(d .. '/b/model.safetensors.index.json'), q(x .. '/'))) == 0)
    T.raises(function() hf.from_pretrained(x) end, 'model.safetensors.index.json is from export')
  end)

  it('refuses an unfinished export, and one a file of is missing', function()
    local x = copy(d .. '/a', d .. '/x')
    local m = manifest(x)
    m.state = 'writing'
    files.write_atomic(x .. '/fsdp_export.json', json.encode(m))
    for _, load in ipairs({ hf.from_pretrained, fsdp.load_safetensors_dir, pretrained.open }) do
      T.raises(function() load(x) end, x .. ' is an unfinished export (fsdp_export.json says "writing")')
    end
    x = copy(d .. '/a', d .. '/x')
    os.remove(x .. '/config.json')
    T.raises(function() hf.from_pretrained(x) end,
      x .. ' is not a complete export: config.json is missing (its fsdp_export.json lists it)')
    T.raises(function() pretrained.open(x) end, 'config.json is missing')
  end)

  it("loads directories without a manifest (transformers') as before", function()
    assert.equals(2, hf.from_pretrained(GOLDEN .. 'llama3_tiny_sharded').config.n_layers)
    local x = copy(d .. '/a', d .. '/x')
    os.remove(x .. '/fsdp_export.json')
    assert.is_true(same(hf.from_pretrained(x), A))
    files.remove_tree(x)
  end)

  -- A child exporting B over A (tools/export.lua), killed by the test
  -- hook at a step of the commit; the directories it left.
  local function killed_at(point, env)
    local p = T.tmpdir()
    fsdp.checkpointing.save_full_state_dict(p .. '/B.safetensors', B)
    copy(d .. '/a', p .. '/out')
    -- The status echoed (the shell then reports the kill into the output).
    local out = T.sh(('%s FSDP_TEST_KILL_IN_PUBLISH=%s %s tools/export.lua %s %s --model=tiny; echo "rc=$?"')
      :format(env or '', point, q(host.exe), q(p .. '/B.safetensors'), q(p .. '/out')))
    assert(out:find('rc=137', 1, true), out)
    os.remove(p .. '/B.safetensors')
    local left = {}
    for _, n in ipairs(files.list(p)) do
      if n ~= 'out' then left[n:match('^%.out%.(%a+)%-')] = p .. '/' .. n end
    end
    return p, left
  end

  it('refuses the leftovers of an interrupted export by name; the next export restores and removes them', function()
    -- Killed between its two renames: the directory is missing, the old
    -- export whole beside it, named by every loader.
    local p, left = killed_at('aside', 'FSDP_TEST_NO_EXCHANGE=1')
    assert.equals(nil, files.lmode(p .. '/out'))
    local restore = ('`mv %s %s` restores it'):format(left.old, p .. '/out')
    T.raises(function() hf.from_pretrained(p .. '/out') end, p .. '/out is not a directory (an interrupted export '
      .. 'moved the previous one to ' .. left.old .. ': ' .. restore)
    T.raises(function() pretrained.open(p .. '/out') end, restore)
    T.raises(function() hf.from_pretrained(left.old) end, left.old .. ' is the previous export of ' .. p .. '/out, '
      .. 'moved aside by an interrupted export: ' .. restore)
    T.raises(function() hf.from_pretrained(left.partial) end, left.partial .. ' is the temporary directory of an '
      .. 'interrupted export to ' .. p .. '/out, not an export')
    local out, rc = T.run_script('recipes/generate.lua', ('--init_from=%s --prompt_ids=1 --max_new_tokens=1')
      :format(q(p .. '/out')))
    assert(rc == 2 and out:find(restore, 1, true) and select(2, out:gsub('\n', '')) == 1, out)
    -- The next export first puts A back (a failure after that leaves the
    -- user where they were), then removes the rest.
    local stage = publish.begin(p .. '/out')
    assert.is_true(same(hf.from_pretrained(p .. '/out'), A))
    stage:abort()
    assert.same({ 'out' }, files.list(p))
    files.remove_tree(p)
    -- Killed with the new export complete beside the old, and with the
    -- old one half removed.
    for _, point in ipairs({ 'complete', 'discarding' }) do
      p, left = killed_at(point)
      assert.is_true(same(hf.from_pretrained(p .. '/out'), point == 'complete' and A or B))
      T.raises(function() hf.from_pretrained(left.partial) end, left.partial)
      if point == 'complete' then
        -- as if killed while a discard rewrote its complete manifest: the
        -- manifest's temporary file beside it is still a leftover of ours
        files.write_atomic(left.partial .. '/' .. publish.MANIFEST .. '.tmp.4242', '{')
      end
      hf.save_pretrained(B, p .. '/out')
      assert.same({ 'out' }, files.list(p))
      files.remove_tree(p)
    end
  end)

  -- The start time of process p as /proc/P/stat gives it (field 22; the
  -- fields counted from the last ')', since the command may hold some).
  local ffi = require 'ffi'
  pcall(ffi.cdef, 'int getppid(void); int getpid(void);')
  local function start_of(p)
    local f = assert(io.open(('/proc/%s/stat'):format(p), 'rb'))
    local rest = f:read('*a'):match('^.*%)%s+(.*)$')
    f:close()
    local fields = {}
    for w in rest:gmatch('%S+') do fields[#fields + 1] = w end
    return fields[20] -- field 22: the 20th after the command
  end

  -- An export's sibling `.out.KIND-HOST-PID[-START]` in p, for a manifest
  -- of stage (nil: an empty directory, as a probe).
  local function leftover(p, stage, kind, name_tail)
    local host_ = stage.dir:match('%.out%.partial%-([^/]-)%-%d+%-%d+$')
    local path = ('%s/.out.%s-%s-%s'):format(p, kind, host_, name_tail)
    if kind == 'probe' then files.mkdir_p(path)
    else assert(os.execute(('cp -a %s %s'):format(q(kind == 'old' and p .. '/out' or stage.dir), q(path))) == 0) end
    return path:match('[^/]+$')
  end

  it('leaves a sibling that is not ours, or of a process that runs', function()
    local p = T.tmpdir()
    hf.save_pretrained(A, p .. '/out')
    -- Ours of a live process: our parent at its start time, and pid 1 in
    -- the older name without one (judged by the pid alone, as before);
    -- and one of another host.
    local stage = publish.begin(p .. '/out')
    local ppid = ffi.C.getppid()
    local kept = { '.out.partial-elsewhere-7' }
    for _, kind in ipairs({ 'partial', 'old', 'probe' }) do
      kept[#kept + 1] = leftover(p, stage, kind, ('%d-%s'):format(ppid, start_of(ppid)))
      kept[#kept + 1] = leftover(p, stage, kind, '1')
    end
    stage:abort()
    files.mkdir_p(p .. '/.out.partial-elsewhere-7')
    write(p .. '/.out.partial-elsewhere-7/notes.txt', 'mine')
    hf.save_pretrained(B, p .. '/out')
    kept[#kept + 1] = 'out'
    table.sort(kept)
    assert.same(kept, files.list(p))
    files.remove_tree(p)
  end)

  it('removes the leftovers of a killed export whose pid a process that started later now has', function()
    -- (pid_max is 32768 on many machines: on a busy one a killed export's
    -- pid was taken by another process within seconds, and its leftovers
    -- were kept as those of a running export.)
    local p = T.tmpdir()
    hf.save_pretrained(A, p .. '/out')
    local stage = publish.begin(p .. '/out')
    -- Named after this process: pid and start time.
    assert.equals(('-%d-%s'):format(ffi.C.getpid(), start_of('self')), stage.dir:match('%-%d+%-%d+$'))
    assert.equals(start_of('self'), manifest(stage.dir).writer.start)
    -- Our parent runs, but started at another time than the one named: the
    -- export that named them is gone.
    local ppid = ffi.C.getppid()
    local other = ('%d-%s'):format(ppid, tostring(tonumber(start_of(ppid)) + 1))
    for _, kind in ipairs({ 'partial', 'old', 'probe' }) do leftover(p, stage, kind, other) end
    stage:abort()
    assert.equals(4, #files.list(p))
    hf.save_pretrained(B, p .. '/out')
    assert.same({ 'out' }, files.list(p))
    assert.is_true(same(hf.from_pretrained(p .. '/out'), B))
    files.remove_tree(p)
  end)

  teardown(function() files.remove_tree(d) end)
end)

describe('--export_hf and tools/export.lua', function()
  local d = T.tmpdir()
  local base = d .. '/base'
  files.mkdir_p(base)
  assert(os.execute(('cp %s/config.json %s/model.safetensors %s/'):format(GOLDEN .. 'llama3_tiny_v5',
    GOLDEN .. 'llama3_tiny_v5', q(base))) == 0)
  local weights = files.read(base .. '/model.safetensors')
  local TRAIN = '--max_steps=2 --warmup_steps=1 --seq_len=8 --batch_size=2'

  local function refused(script, args, text)
    local out, rc = T.run_script(script, args)
    assert(rc == 2, ('%s %s: exit %d\n%s'):format(script, args, rc, out))
    assert(out:find(text, 1, true), ('%s %s:\n%s'):format(script, args, out))
    assert(not out:find('config:', 1, true), 'refused after the config was printed')
  end

  it('over the directory the model starts from, or its source, is refused naming both; nothing is touched', function()
    assert(os.execute(('ln -s base %s'):format(q(d .. '/link'))) == 0)
    for _, target in ipairs({ base, base .. '/', d .. '/link' }) do
      refused('recipes/llama2_7b.lua', ('--init_from=%s --export_hf=%s %s'):format(base, target, TRAIN),
        ('--export_hf %s is --init_from %s: an export there would overwrite the weights this run starts from')
          :format(target, base))
    end
    refused('recipes/llama2_7b.lua', ('--init_from=%s --export_hf=%s %s'):format(base, d, TRAIN),
      ('--export_hf %s holds --init_from %s: an export replaces its directory whole'):format(d, base))
    -- A checkpoint of a run that started from base: exporting it (or a run
    -- starting from it) over base is refused too.
    local out, rc = T.run_script('recipes/llama2_7b.lua', ('--init_from=%s %s --checkpoint_dir=%s --checkpoint_freq=2 '
      .. '--export_hf=%s'):format(base, TRAIN, d .. '/ckpt', d .. '/hf'))
    assert(rc == 0, out)
    refused('tools/export.lua', ('%s %s'):format(d .. '/ckpt', base),
      ('DIR %s is %s, the Hugging Face directory that %s'):format(base, base, d .. '/ckpt'))
    refused('recipes/llama2_7b.lua', ('--init_from=%s --export_hf=%s %s'):format(d .. '/ckpt', base, TRAIN),
      ('--export_hf %s is %s, the Hugging Face directory that %s'):format(base, base, d .. '/ckpt'))
    refused('recipes/llama2_7b.lua', ('--init_from=%s --export_hf=%s --checkpoint_dir=%s %s'):format(base,
      d .. '/ckpt', d .. '/ckpt', TRAIN), ('--export_hf %s is --checkpoint_dir %s'):format(d .. '/ckpt', d .. '/ckpt'))
    assert.same({ 'config.json', 'model.safetensors' }, files.list(base))
    assert(files.read(base .. '/model.safetensors') == weights, 'the pretrained weights changed')
    -- The run's own earlier export is replaced, offline too.
    out, rc = T.run_script('tools/export.lua', ('%s %s'):format(d .. '/ckpt', d .. '/hf'))
    assert(rc == 0, out)
  end)

  it("into a directory of the user's is refused before any work, naming what it holds", function()
    files.mkdir_p(d .. '/mine')
    write(d .. '/mine/notes.txt', 'mine')
    refused('recipes/llama2_7b.lua', ('--init_from=%s --export_hf=%s %s'):format(base, d .. '/mine', TRAIN),
      ('--export_hf: %s is not empty (it holds notes.txt)'):format(d .. '/mine'))
    refused('tools/export.lua', ('%s %s'):format(d .. '/ckpt', d .. '/mine'),
      ('DIR: %s is not empty (it holds notes.txt)'):format(d .. '/mine'))
    assert.same({ 'notes.txt' }, files.list(d .. '/mine'))
  end)

  it('over an export or an empty directory holding a write probe a killed process left is not refused', function()
    -- (the option check creates and removes .fsdp-lua-write-probe-*: a kill
    -- in between left one, and re-exporting was refused as a user's file)
    for _, dir in ipairs({ d .. '/hf', d .. '/probe_only' }) do
      files.mkdir_p(dir)
      write(dir .. '/' .. files.WRITE_PROBE .. '0-1-1-abc', '')
      local out, rc = T.run_script('tools/export.lua', ('%s %s'):format(d .. '/ckpt', dir))
      assert(rc == 0, out)
      for _, name in ipairs(files.list(dir)) do assert.is_false(files.is_write_probe(name), name) end
    end
  end)

  teardown(function() files.remove_tree(d) end)
end)

describe('tests/chaos/export_kill.lua', function()
  it('24 exports killed at random and 5 at the steps of a commit: no directory loads as a mix', function()
    local out, rc = T.run_script('tests/chaos/export_kill.lua', '24', 170)
    assert(rc == 0 and out:find('\nok %- '), out)
  end)
end)
