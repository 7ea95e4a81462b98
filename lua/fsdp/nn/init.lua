-- fsdp.nn: modules, parameters and their init rules.
--
--   local nn = require 'fsdp.nn'
--   local Net = nn.Module:extend('Net')
--   function Net:__init() self.fc = nn.Linear(4, 2) end
--   function Net:forward(x) return self.fc(x) end
--   local net = Net():init_weights({seed = 1})
--
-- Layers call fsdp.functional for their math (loaded when first called, so
-- models can be built and printed on meta without any kernel).
local parameter = require 'fsdp.nn.parameter'
local container = require 'fsdp.nn.container'
local norm = require 'fsdp.nn.norm'
local activation = require 'fsdp.nn.activation'
local mlp = require 'fsdp.nn.mlp'

local M = {}

M.Module = require 'fsdp.nn.module'
M.is_module = M.Module.is_module
M.Parameter = parameter.Parameter
M.init = parameter.init
-- The random stream of a parameter name (FNV-1a-64), see fsdp.nn.parameter.
M.init_stream = parameter.stream
-- Fill a tensor (or a shard of one, with key.offset) from an init rule:
-- nn.init_fill(t, rule, {seed=, name=, offset=}).
M.init_fill = parameter.fill

M.Sequential = container.Sequential
M.ModuleList = container.ModuleList
M.ModuleDict = container.ModuleDict

M.Linear = require 'fsdp.nn.linear'
M.LoRALinear = require 'fsdp.nn.lora'
M.Embedding = require 'fsdp.nn.embedding'
M.RMSNorm = norm.RMSNorm
M.LayerNorm = norm.LayerNorm
M.Dropout = require 'fsdp.nn.dropout'
M.Conv2d = require 'fsdp.nn.conv'
M.MaxPool2d = require 'fsdp.nn.pooling'
M.Flatten = require 'fsdp.nn.flatten'
M.ReLU = activation.ReLU
M.GELU = activation.GELU
M.SiLU = activation.SiLU
-- Transformer blocks: attention with its projections, the feed-forwards.
M.Attention = require 'fsdp.nn.attention'
M.GatedMLP = mlp.GatedMLP
M.MLP = mlp.MLP
-- A sparse mixture of experts (Mixtral, Qwen3-MoE) and its fused experts.
local moe = require 'fsdp.nn.moe'
M.MoE = moe.MoE
M.MoEExperts = moe.MoEExperts

M.utils = require 'fsdp.nn.utils'

return M
