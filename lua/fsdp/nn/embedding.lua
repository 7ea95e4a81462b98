-- fsdp.nn.embedding: nn.Embedding, a lookup table of num_embeddings rows
-- of size embedding_dim, as torch.nn.Embedding.
--
--   nn.Embedding(num_embeddings, embedding_dim, {device =, dtype =, init = rule})
--
-- Default init N(0, 1), as PyTorch.
local core = require 'fsdp.core'
local validate = require 'fsdp.validate'
local Module = require 'fsdp.nn.module'
local parameter = require 'fsdp.nn.parameter'
local functional = require 'fsdp.functional'

local Embedding = Module:extend('Embedding')

function Embedding:__init(num_embeddings, embedding_dim, opts)
  opts = opts or {}
  for _, v in ipairs({ num_embeddings, embedding_dim }) do
    if validate.problem(v, validate.INDEX) then
      core.fail(('Embedding: sizes must be non-negative integers, got %s'):format(validate.show(v)))
    end
  end
  self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
  self:register_parameter('weight', parameter.Parameter({ num_embeddings, embedding_dim },
    { init = opts.init or parameter.init.normal(1), device = opts.device, dtype = opts.dtype }))
end

function Embedding:forward(ids)
  return functional.embedding(ids, self.weight)
end

function Embedding:extra_repr()
  return ('%d, %d'):format(self.num_embeddings, self.embedding_dim)
end

return Embedding
