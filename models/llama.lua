-- models/llama.lua: the Llama 2 / Llama 3 family, with Hugging Face
-- parameter names (model.layers.N.self_attn.q_proj.weight, ...), so that
-- Hugging Face checkpoints load unchanged and our exports load in HF.
--
-- This is the family under its old name (recipes, specs and user code
-- require 'models.llama'); it is declared in models/families/llama.lua
-- as a table of choices over models/decoder.lua, like every other family.
return require 'models.families.llama'
