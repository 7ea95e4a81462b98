-- fsdp.io.safetensors: safetensors files, one (fsdp.io.safetensors_file:
-- open, load, save) or many (Hugging Face's multi-file layout,
-- fsdp.io.safetensors_sharded: open_checkpoint, load_dir, load_into,
-- save_sharded, parse_size), from one module.
--
--   local st = require 'fsdp.io.safetensors'
--   local tensors, names, meta = st.load('model.safetensors')
--   st.save('out.safetensors', {['w'] = w, ['b'] = b}, {format = 'pt'}, {checksum = true})
--   local f = st.open(path); f:info(name); f:get(name); f:verify(); f:close()
--   local c = st.open_checkpoint(dir); st.load_into(model, dir); st.save_sharded(dir, tensors, opts)
local file = require 'fsdp.io.safetensors_file'
local sharded = require 'fsdp.io.safetensors_sharded'

local M = {}
for k, v in pairs(file) do M[k] = v end
M.open_checkpoint = sharded.open_checkpoint
M.load_dir = sharded.load_dir
M.load_into = sharded.load_into
M.save_sharded = sharded.save_sharded
M.parse_size = sharded.parse_size

return M
