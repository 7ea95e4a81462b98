-- fsdp.renamed: the old names of modules renamed so that each word of the
-- project has one meaning (issue 42; the words in docs/ARCHITECTURE.md,
-- "Names"). Scripts written against an old name keep running: the host
-- (core/host/main.c) calls install() before any user code, which puts a
-- loader for each old name in package.preload that returns the module
-- under its new name (the same table, loaded once).
--
-- "recipe" is a runnable script under recipes/, so the option parser and
-- the option sets the recipes share lost the word; none of the new names
-- is an alias for anything else.
local M = {}

-- old name -> new name
M.MODULES = {
  ['fsdp.recipe'] = 'fsdp.options',
  ['fsdp.sharding.recipe'] = 'fsdp.sharding.options',
  ['fsdp.checkpointing.recipe'] = 'fsdp.checkpointing.options',
  ['fsdp.data.corpus_recipe'] = 'fsdp.data.corpus_options',
  ['models.decoder_recipe'] = 'models.decoder_training',
  ['models.t5_recipe'] = 'models.t5_training',
}

-- Adds the loaders to preload (package.preload); an entry already there
-- is kept.
function M.install(preload)
  for old, new in pairs(M.MODULES) do
    if preload[old] == nil then
      -- lazy: the new module loads only when a script asks for its old name
      preload[old] = function() return require(new) end
    end
  end
end

return M
