-- models/llama.lua: the Llama family under its old name (recipes, specs
-- and user code require 'models.llama'); the declaration lives in
-- models/families/llama.lua, the model in models/decoder.lua.
return require 'models.families.llama'
