-- hub_model_spec.lua: --init_from=OWNER/NAME[@REVISION] resolved in the
-- Hugging Face cache as huggingface_hub lays it out ([Note: the hub cache]
-- in lua/fsdp/data/hub.lua): $HF_HUB_CACHE, else $HF_HOME/hub, else
-- ~/.cache/huggingface/hub; refs/<branch> names the snapshot, a commit
-- hash is a snapshot itself; the files are symlinks into blobs/. A local
-- directory of that name wins; a missing one is one line with the
-- download command. The caches are built here in a temporary directory.
local ffi = require 'ffi'
local lfs = require 'lfs'
local T = require 'fsdp.testing'
local hub = require 'fsdp.data.hub'
local pretrained = require 'models.pretrained'
local host = require 'fsdp.host'

pcall(ffi.cdef, 'int setenv(const char *name, const char *value, int overwrite); int unsetenv(const char *name);')

local tmp = T.tmpdir()
teardown(function() os.execute('rm -rf ' .. T.quote(tmp)) end)

local GOLDEN = host.root .. '/tests/golden/hf/'
local HASH, HASH2 = ('ab'):rep(20), ('cd'):rep(20)

-- A repo in cache `cache` as `hf download` leaves it: blobs named by
-- content, snapshots/<hash>/<file> -> ../../blobs/<blob>, refs/main.
local function make_repo(cache, repo, snapshots, refs)
  local base = ('%s/models--%s'):format(cache, repo:gsub('/', '--'))
  local cmds = { ('mkdir -p %s/blobs %s/refs'):format(T.quote(base), T.quote(base)) }
  for hash, src in pairs(snapshots) do
    local snap = base .. '/snapshots/' .. hash
    cmds[#cmds + 1] = 'mkdir -p ' .. T.quote(snap)
    for _, f in ipairs({ 'config.json', 'model.safetensors' }) do
      local blob = hash:sub(1, 8) .. '-' .. f
      cmds[#cmds + 1] = ('cp %s %s && ln -s ../../blobs/%s %s'):format(T.quote(GOLDEN .. src .. '/' .. f),
        T.quote(base .. '/blobs/' .. blob), blob, T.quote(snap .. '/' .. f))
    end
  end
  for ref, hash in pairs(refs) do
    cmds[#cmds + 1] = ('printf %%s %s > %s'):format(hash, T.quote(base .. '/refs/' .. ref))
  end
  assert(os.execute(table.concat(cmds, ' && ')) == 0)
  return base
end

local cache = tmp .. '/hub'
local base = make_repo(cache, 'tiny/llama', { [HASH] = 'llama2_tiny', [HASH2] = 'llama3_tiny' },
  { main = HASH, v3 = HASH2 })

local function env(vars)
  for _, k in ipairs({ 'HF_HUB_CACHE', 'HF_HOME', 'XDG_CACHE_HOME', 'HOME' }) do
    if vars[k] then ffi.C.setenv(k, vars[k], 1) else ffi.C.unsetenv(k) end
  end
end
local saved = {}
for _, k in ipairs({ 'HF_HUB_CACHE', 'HF_HOME', 'XDG_CACHE_HOME', 'HOME' }) do saved[k] = os.getenv(k) end
after_each(function() env(saved) end)

describe('--init_from=OWNER/NAME in the Hugging Face cache', function()
  it('resolves refs/main, a branch and a commit hash to their snapshot', function()
    env({ HF_HUB_CACHE = cache })
    assert.equals(base .. '/snapshots/' .. HASH, hub.model_dir('tiny/llama'))
    assert.equals(base .. '/snapshots/' .. HASH2, hub.model_dir('tiny/llama@v3'))
    assert.equals(base .. '/snapshots/' .. HASH2, hub.model_dir('tiny/llama@' .. HASH2))
    local src = pretrained.open('tiny/llama')
    assert.equals('hf', src.kind)
    assert.equals('tiny/llama', src.hub_name)
    assert.equals(base .. '/snapshots/' .. HASH, src.path)
    -- the two snapshots are different models (llama2_tiny, llama3_tiny)
    assert.is_nil(src.config.rope_scaling)
    assert.equals('llama3', pretrained.open('tiny/llama@v3').config.rope_scaling.rope_type)
  end)

  it('finds the cache under $HF_HOME/hub, else ~/.cache/huggingface/hub', function()
    local home = tmp .. '/home'
    make_repo(home .. '/.cache/huggingface/hub', 'o/m', { [HASH] = 'llama2_tiny' }, { main = HASH })
    make_repo(tmp .. '/hfhome/hub', 'o/m', { [HASH2] = 'llama3_tiny' }, { main = HASH2 })
    env({ HOME = home })
    assert.equals(home .. '/.cache/huggingface/hub/models--o--m/snapshots/' .. HASH, hub.model_dir('o/m'))
    env({ HOME = home, HF_HOME = tmp .. '/hfhome' })
    assert.equals(tmp .. '/hfhome/hub/models--o--m/snapshots/' .. HASH2, hub.model_dir('o/m'))
    env({ HOME = home, HF_HOME = tmp .. '/hfhome', HF_HUB_CACHE = cache })
    local ok, err = pcall(hub.model_dir, 'o/m')
    assert.is_false(ok)
    assert.matches(cache .. '/models--o--m', err, 1, true)
  end)

  it('lets a local directory of that name win', function()
    env({ HF_HUB_CACHE = cache })
    assert(os.execute(('mkdir -p %s/tiny && cp -r %s %s/tiny/llama'):format(T.quote(tmp),
      T.quote(GOLDEN .. 'llama3_tiny'), T.quote(tmp))) == 0)
    local here = lfs.currentdir()
    assert(lfs.chdir(tmp))
    local ok, src = pcall(pretrained.open, 'tiny/llama')
    lfs.chdir(here)
    assert(ok, src)
    assert.equals('tiny/llama', src.path)
    assert.is_nil(src.hub_name)
    assert.equals('llama3', src.config.rope_scaling.rope_type)
  end)

  it('names the download command in one line when the cache lacks the model or the revision', function()
    env({ HF_HUB_CACHE = cache })
    for _, case in ipairs({
      { 'nobody/none', 'get it with `hf download nobody/none` (or `huggingface-cli download nobody/none`)' },
      { 'tiny/llama@v9', 'get it with `hf download tiny/llama --revision v9`' },
    }) do
      local ok, err = pcall(pretrained.open, case[1])
      assert.is_false(ok)
      err = tostring(err)
      assert.is_nil(err:find('\n'), err)
      assert.matches(case[1] .. ' is not a local directory, and the Hugging Face cache holds no snapshot', err, 1, true)
      assert.matches(case[2], err, 1, true)
    end
  end)

  it('starts a recipe from the cache, and refuses a missing name before building anything', function()
    local envs = 'env HF_HUB_CACHE=' .. T.quote(cache) .. ' '
    local out, rc = T.sh(envs .. ('timeout 120 %s recipes/llama2_7b.lua --init_from=tiny/llama --max_steps=2 '
      .. '--warmup_steps=1 --seq_len=8 --batch_size=2'):format(T.quote(host.exe)))
    assert.equals(0, rc, out)
    assert.matches('init_from: loaded Hugging Face directory ' .. base .. '/snapshots/' .. HASH, out, 1, true)
    out, rc = T.sh(envs .. ('timeout 120 %s recipes/llama2_7b.lua --init_from=tiny/nope --max_steps=2 --warmup_steps=1')
      :format(T.quote(host.exe)))
    assert.is_not.equals(0, rc)
    assert.matches('hf download tiny/nope', out, 1, true)
  end)
end)
