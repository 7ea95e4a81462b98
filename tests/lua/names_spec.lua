-- names_spec.lua: one meaning per name (issue 42; docs/ARCHITECTURE.md,
-- "Names"). The old names of renamed modules still load, as the same
-- module (lua/fsdp/renamed.lua, installed by the host); no file of the
-- project requires one by its old name; and no file reads a global named
-- like the old locals (`recipe.config` where the module is now `options`):
-- a line merged from a branch written before the renames would otherwise
-- fail only when it runs.
local renamed = require 'fsdp.renamed'
local T = require 'fsdp.testing'

local host = require 'fsdp.host'
local ROOTS = 'lua models recipes tools benchmarks tests/lua tests/mpi tests/chaos tests/fuzz'

local function project_files()
  local p = assert(io.popen(('cd %s && find %s -name "*.lua" | sort'):format(T.quote(host.root), ROOTS)))
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

describe('renamed modules', function()
  it('load under their old names as the same table as under the new ones', function()
    local n = 0
    for old, new in pairs(renamed.MODULES) do
      assert.are.equal(require(new), require(old), old)
      n = n + 1
    end
    assert.is_true(n >= 6)
  end)

  it('keep an entry already in package.preload', function()
    local mine = function() return 'mine' end
    local preload = { ['fsdp.recipe'] = mine }
    renamed.install(preload)
    assert.are.equal(mine, preload['fsdp.recipe'])
    assert.is_function(preload['fsdp.sharding.recipe'])
  end)

  it('are required by their new names everywhere in the project', function()
    local files = project_files()
    assert.is_true(#files > 200, #files)
    local found = {}
    for _, f in ipairs(files) do
      if f ~= 'lua/fsdp/renamed.lua' and f ~= 'tests/lua/names_spec.lua' then
        local src = assert(io.open(host.root .. '/' .. f)):read('*a')
        for old in pairs(renamed.MODULES) do
          local q = old:gsub('%.', '%%.')
          for _, pat in ipairs({ "require%s*%(?%s*'" .. q .. "'", 'require%s*%(?%s*"' .. q .. '"' }) do
            if src:find(pat) then found[#found + 1] = f .. ': ' .. old end
          end
        end
      end
    end
    assert.are.same({}, found)
  end)

  it('leave no use of a renamed field (fsdp.checkpointing.layout, plan_units)', function()
    local OLD_FIELDS = { 'ckpt%.layout%f[^%w_]', "checkpointing'%)%.layout%f[^%w_]", '%f[%w_]plan_units%f[^%w_]' }
    local found = {}
    for _, f in ipairs(project_files()) do
      if f ~= 'tests/lua/names_spec.lua' then
        local src = assert(io.open(host.root .. '/' .. f)):read('*a')
        for _, pat in ipairs(OLD_FIELDS) do
          if src:find(pat) then found[#found + 1] = f .. ': ' .. pat end
        end
      end
    end
    assert.are.same({}, found)
  end)
end)

describe('the old local names', function()
  -- Globals nothing defines: each was the local of a module now named otherwise.
  local OLD_LOCALS = { recipe = 'options', shard_recipe = 'shard_options', ckpt_recipe = 'ckpt_options',
                       corpus_recipe = 'corpus_options', decoder_recipe = 'decoder_training',
                       layout = 'directory, where it was fsdp.checkpointing.layout' }

  it('are read as globals by no file (luajit -bl lists each global read)', function()
    local files = project_files()
    local list = {}
    for _, f in ipairs(files) do list[#list + 1] = T.quote(f) end
    local p = assert(io.popen(('cd %s && for f in %s; do echo "== $f"; luajit -bl "$f" 2>&1; done')
      :format(T.quote(host.root), table.concat(list, ' '))))
    local file, reads, found = nil, 0, {}
    for l in p:lines() do
      local f = l:match('^== (.*)$')
      if f then file = f end
      local g = l:match('GGET%s.-; "([%w_]+)"')
      if g then
        reads = reads + 1
        if OLD_LOCALS[g] then found[#found + 1] = ('%s reads global %s (now %s)'):format(file, g, OLD_LOCALS[g]) end
      end
    end
    p:close()
    assert.is_true(reads > 1000, reads) -- the listing was read (require, pairs, ... are globals)
    assert.are.same({}, found)
  end)

  it('are found where a file does read one', function()
    local path = os.tmpname()
    local f = assert(io.open(path, 'w'))
    f:write("local options = require 'fsdp.options'\nreturn recipe.config({}, {}, 'x.lua')\n")
    f:close()
    local p = assert(io.popen('luajit -bl ' .. T.quote(path) .. ' 2>&1'))
    local out = p:read('*a')
    p:close()
    os.remove(path)
    assert.matches('GGET%s.-; "recipe"', out)
  end)
end)
