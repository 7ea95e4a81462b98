-- models/deepvit.lua: DeepViT, the vision transformer with re-attention
-- (Zhou et al. 2021, "DeepViT: Towards Deeper Vision Transformer"; layout of
-- vit-pytorch's deepvit.py, 2022, without patch LayerNorms; patch_norm =
-- true adds those of today's deepvit.py: LayerNorm(patch_dim) -> Linear ->
-- LayerNorm(dim)).
--
--   local deepvit = require 'models.deepvit'
--   local m = deepvit.build('8B', {device = 'meta'})  -- 8,007,494,160 parameters
--   local logits = deepvit.build('tiny')(images)       -- images f32 [B, 3, H, W]
--   local m2 = deepvit.from_vit_pytorch('dir')          -- vit-pytorch's state_dict, either layout
--
-- Re-attention, per block: dots = q k^T * dim_head^-0.5; softmax; dropout;
-- mix the heads with a learnable theta [H, H] (attn'[b,g,i,j] = sum_h
-- attn[b,h,i,j] theta[h,g]); LayerNorm over the head axis; attn' v; output
-- Linear with bias. Patches are flattened (p1 p2 c) and embedded by a
-- Linear; a class token and learned positions are added; the class token's
-- output goes through LayerNorm and a Linear head.
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'
local F = require 'fsdp.functional'
local common = require 'models.common'
local safetensors_sharded = require 'fsdp.io.safetensors_sharded'

local M = {}

local BASE = { image_size = 256, patch_size = 32, dim = 1024, mlp_dim = 2048, dim_head = 64,
               num_classes = 10000, channels = 3, dropout = 0.1, emb_dropout = 0.1 }

local function config(fields)
  local c = {}
  for k, v in pairs(BASE) do c[k] = v end
  for k, v in pairs(fields) do c[k] = v end
  return c
end

-- The configs of the FSDP DeepViT experiments (MODELS.md), and a tiny one.
M.configs = {
  ['60M'] = config({ depth = 10, heads = 8 }),
  ['1B'] = config({ depth = 118, heads = 16 }),
  ['3B'] = config({ depth = 357, heads = 16 }),
  ['8B'] = config({ depth = 952, heads = 16 }),
  tiny = config({ image_size = 32, patch_size = 8, dim = 64, mlp_dim = 128, dim_head = 16, depth = 2,
                  heads = 4, num_classes = 10, dropout = 0, emb_dropout = 0 }),
}

-- Every field a config or an override may set (anything else is a typo).
local FIELDS = common.set({ 'image_size', 'patch_size', 'dim', 'mlp_dim', 'dim_head', 'num_classes', 'channels',
                            'dropout', 'emb_dropout', 'depth', 'heads', 'patch_norm' })

function M.config(name_or_config, overrides)
  local c = common.merge_config('deepvit', M.configs, BASE, nil, name_or_config, overrides, FIELDS)
  common.check_fields('deepvit', c, { 'image_size', 'patch_size', 'dim', 'mlp_dim', 'dim_head', 'num_classes',
                                      'channels', 'depth', 'heads' }, { 'dropout', 'emb_dropout' })
  if c.image_size % c.patch_size ~= 0 then
    error(('deepvit config: image_size %d is not a multiple of patch_size %d'):format(c.image_size, c.patch_size), 2)
  end
  c.num_patches = (c.image_size / c.patch_size) ^ 2
  c.patch_dim = c.channels * c.patch_size ^ 2
  return c
end

-- Parameters in closed form (a check on the build, and what the recipes
-- bound before building): per block the attention's norm, to_qkv, theta
-- [H, H], the head-axis norm and to_out with its bias, the MLP's norm and
-- two Linears with biases; the patch Linear, positions, class token,
-- final norm and head (and the patch norms of the current layout).
function M.closed_form_parameters(c)
  local d, inner, H, m = c.dim, c.heads * c.dim_head, c.heads, c.mlp_dim
  local block = 2 * d + 3 * d * inner + H * H + 2 * H + inner * d + d + 2 * d + d * m + m + m * d + d
  local rest = c.patch_dim * d + d + (c.num_patches + 1) * d + d + 2 * d + d * c.num_classes + c.num_classes
  if c.patch_norm then rest = rest + 2 * c.patch_dim + 2 * d end
  return c.depth * block + rest
end

-- Training FLOPs per image (MODELS.md): n tokens, L blocks.
function M.flops_per_image(c)
  local n, L, d, inner = c.num_patches + 1, c.depth, c.dim, c.heads * c.dim_head
  return 6 * (n * L * (4 * d * inner + 2 * d * c.mlp_dim) + n * c.patch_dim * d + d * c.num_classes)
    + 12 * L * n * n * inner + 6 * L * c.heads * c.heads * n * n
end

local ReAttention = nn.Module:extend('ReAttention')

function ReAttention:__init(c, o)
  self.heads, self.dim_head = c.heads, c.dim_head
  local inner = c.heads * c.dim_head
  self.norm = nn.LayerNorm(c.dim, o)
  self.to_qkv = nn.Linear(c.dim, 3 * inner, { bias = false, device = o.device, dtype = o.dtype })
  self.dropout = nn.Dropout(c.dropout)
  self:register_parameter('reattn_weights', nn.Parameter({ c.heads, c.heads },
    { init = nn.init.normal(1), device = o.device, dtype = o.dtype }))
  self.reattn_norm = nn.LayerNorm(c.heads, o)
  self.to_out = nn.Linear(inner, c.dim, o)
  self.out_dropout = nn.Dropout(c.dropout)
end

function ReAttention:forward(x)
  local B, N = x:size(0), x:size(1)
  local H, D = self.heads, self.dim_head
  local qkv = self.to_qkv(self.norm(x)):view(B, N, 3, H, D):permute(2, 0, 3, 1, 4) -- [3, B, H, N, D]
  local q, k, v = qkv[0], qkv[1], qkv[2]
  local attn = F.softmax(q:matmul(k:transpose(-1, -2)) * (D ^ -0.5), -1)
  attn = self.dropout(attn)
  -- mix heads: [B, H, N, N] -> [B, N, N, H] @ theta [H, G] -> [B, G, N, N]
  local mixed = attn:permute(0, 2, 3, 1):matmul(self.reattn_weights)
  -- LayerNorm over the head axis, which is last here
  attn = self.reattn_norm(mixed):permute(0, 3, 1, 2)
  local out = attn:matmul(v):transpose(1, 2):reshape(B, N, H * D)
  return self.out_dropout(self.to_out(out))
end

local FeedForward = nn.Module:extend('FeedForward')

function FeedForward:__init(c, o)
  self.norm = nn.LayerNorm(c.dim, o)
  self.fc1 = nn.Linear(c.dim, c.mlp_dim, o)
  self.fc2 = nn.Linear(c.mlp_dim, c.dim, o)
  self.dropout = nn.Dropout(c.dropout)
end

function FeedForward:forward(x)
  return self.dropout(self.fc2(self.dropout(F.gelu(self.fc1(self.norm(x))))))
end

-- The transformer block: the class wrap and checkpoint policies name.
local Block = nn.Module:extend('DeepViTBlock')
M.Block = Block

function Block:__init(c, o)
  self.attn = ReAttention(c, o)
  self.ff = FeedForward(c, o)
end

function Block:forward(x)
  x = x + self.attn(x)
  return x + self.ff(x)
end

local DeepViT = nn.Module:extend('DeepViT')
M.DeepViT = DeepViT

function DeepViT:__init(c, o)
  self.config = c
  if c.patch_norm then self.patch_norm_in = nn.LayerNorm(c.patch_dim, o) end
  self.to_patch_embedding = nn.Linear(c.patch_dim, c.dim, o)
  if c.patch_norm then self.patch_norm_out = nn.LayerNorm(c.dim, o) end
  self:register_parameter('pos_embedding', nn.Parameter({ 1, c.num_patches + 1, c.dim },
    { init = nn.init.normal(1), device = o.device, dtype = o.dtype }))
  self:register_parameter('cls_token', nn.Parameter({ 1, 1, c.dim },
    { init = nn.init.normal(1), device = o.device, dtype = o.dtype }))
  self.dropout = nn.Dropout(c.emb_dropout)
  self.layers = nn.ModuleList()
  for _ = 1, c.depth do self.layers:append(Block(c, o)) end
  self.norm = nn.LayerNorm(c.dim, o)
  self.head = nn.Linear(c.dim, c.num_classes, o)
end

-- images [B, C, H, W] -> patches [B, (H/p)(W/p), p*p*C] in (p1 p2 c) order.
function DeepViT:patches(img)
  local c = self.config
  local B, C = img:size(0), img:size(1)
  if C ~= c.channels or img:size(2) ~= c.image_size or img:size(3) ~= c.image_size then
    error(('deepvit: expected images [B, %d, %d, %d], got %s'):format(c.channels, c.image_size,
      c.image_size, '[' .. table.concat(img.shape, ', ') .. ']'), 0)
  end
  local p, h = c.patch_size, c.image_size / c.patch_size
  return img:view(B, C, h, p, h, p):permute(0, 2, 4, 3, 5, 1):reshape(B, h * h, p * p * C)
end

function DeepViT:forward(img)
  local x = self:patches(img)
  if self.patch_norm_in then x = self.patch_norm_in(x) end
  x = self.to_patch_embedding(x)
  if self.patch_norm_out then x = self.patch_norm_out(x) end
  local B = x:size(0)
  local cls = self.cls_token:expand(B, 1, self.config.dim)
  x = self.dropout(F.cat({ cls, x }, 1) + self.pos_embedding)
  for _, block in ipairs(self.layers) do x = block(x) end
  return self.head(self.norm(x:select(1, 0)))
end

-- Mean cross-entropy of the classes of images [B, C, H, W] against
-- labels i64 [B]. Returns loss, logits.
function DeepViT:loss(images, labels)
  local logits = self(images)
  return F.cross_entropy(logits, labels), logits
end

-- fsdp.plan's example batch: images f32 [batch, C, H, W] and labels i64
-- [batch] on meta (seq has no meaning here); the arguments of loss, the
-- tokens (patches and the class token of every image) and 1.
function DeepViT:example_batch(batch)
  local c = self.config
  local images = fsdp.empty({ batch, c.channels, c.image_size, c.image_size }, { dtype = 'f32', device = 'meta' })
  local labels = fsdp.empty({ batch }, { dtype = 'i64', device = 'meta' })
  return { n = 2, images, labels }, batch * (c.num_patches + 1), 1
end

function M.build(name_or_config, opts)
  local placement, overrides = common.split_build_opts(opts)
  return DeepViT(M.config(name_or_config, overrides), placement)
end

-- vit-pytorch checkpoints ----------------------------------------------------------------

-- vit-pytorch's state_dict names -> ours, per layout. Today's deepvit.py:
-- to_patch_embedding = (Rearrange, LayerNorm, Linear, LayerNorm), blocks
-- [Attention, FeedForward] with their norms inside. 2022's: (Rearrange,
-- Linear), blocks [Residual(PreNorm(Attention)), Residual(PreNorm(FeedForward))]
-- (the norm in PreNorm, the module in .fn.fn).
local LAYOUTS = {
  current = {
    ['^to_patch_embedding%.1%.'] = 'patch_norm_in.', ['^to_patch_embedding%.2%.'] = 'to_patch_embedding.',
    ['^to_patch_embedding%.3%.'] = 'patch_norm_out.',
    ['^transformer%.layers%.(%d+)%.0%.norm%.'] = 'layers.%1.attn.norm.',
    ['^transformer%.layers%.(%d+)%.0%.to_qkv%.'] = 'layers.%1.attn.to_qkv.',
    ['^transformer%.layers%.(%d+)%.0%.reattn_weights$'] = 'layers.%1.attn.reattn_weights',
    ['^transformer%.layers%.(%d+)%.0%.reattn_norm%.1%.'] = 'layers.%1.attn.reattn_norm.',
    ['^transformer%.layers%.(%d+)%.0%.to_out%.0%.'] = 'layers.%1.attn.to_out.',
    ['^transformer%.layers%.(%d+)%.1%.net%.0%.'] = 'layers.%1.ff.norm.',
    ['^transformer%.layers%.(%d+)%.1%.net%.1%.'] = 'layers.%1.ff.fc1.',
    ['^transformer%.layers%.(%d+)%.1%.net%.4%.'] = 'layers.%1.ff.fc2.',
  },
  ['2022'] = {
    ['^to_patch_embedding%.1%.'] = 'to_patch_embedding.',
    ['^transformer%.layers%.(%d+)%.0%.fn%.norm%.'] = 'layers.%1.attn.norm.',
    ['^transformer%.layers%.(%d+)%.0%.fn%.fn%.to_qkv%.'] = 'layers.%1.attn.to_qkv.',
    ['^transformer%.layers%.(%d+)%.0%.fn%.fn%.reattn_weights$'] = 'layers.%1.attn.reattn_weights',
    ['^transformer%.layers%.(%d+)%.0%.fn%.fn%.reattn_norm%.1%.'] = 'layers.%1.attn.reattn_norm.',
    ['^transformer%.layers%.(%d+)%.0%.fn%.fn%.to_out%.0%.'] = 'layers.%1.attn.to_out.',
    ['^transformer%.layers%.(%d+)%.1%.fn%.norm%.'] = 'layers.%1.ff.norm.',
    ['^transformer%.layers%.(%d+)%.1%.fn%.fn%.net%.0%.'] = 'layers.%1.ff.fc1.',
    ['^transformer%.layers%.(%d+)%.1%.fn%.fn%.net%.3%.'] = 'layers.%1.ff.fc2.',
  },
}
local SHARED = { ['^pos_embedding$'] = 'pos_embedding', ['^cls_token$'] = 'cls_token',
                 ['^mlp_head%.0%.'] = 'norm.', ['^mlp_head%.1%.'] = 'head.' }

-- Our name of a vit-pytorch key in a layout ('current' or '2022'), or nil.
function M.name_from_vit_pytorch(name, layout)
  for _, rules in ipairs({ SHARED, LAYOUTS[layout] }) do
    for pattern, repl in pairs(rules) do
      if name:find(pattern) then return (name:gsub(pattern, repl)) end
    end
  end
  return nil
end

-- The layout of a vit-pytorch DeepViT state dict (name -> tensor or a
-- table with .shape): today's has a LayerNorm (1-D weight) at
-- to_patch_embedding.1, 2022's its Linear.
function M.vit_pytorch_layout(shapes, where)
  local w = shapes['to_patch_embedding.1.weight']
  if not w then
    error(('deepvit: %s has no to_patch_embedding.1.weight: not a vit-pytorch DeepViT state dict'):format(where), 0)
  end
  return #w.shape == 1 and 'current' or '2022'
end

-- Build the DeepViT a vit-pytorch state dict describes and load it.
-- `path`: a .safetensors file or a directory with model.safetensors
-- (vit-pytorch saves no config: every size is read off the shapes, given
-- the channels, opts.channels (3)). Other opts: device, dtype, dropout,
-- emb_dropout (0: the values are not in the file).
function M.from_vit_pytorch(path, opts)
  opts = opts or {}
  local st = safetensors_sharded
  local ck = st.open_checkpoint(path)
  local info = {}
  for _, name in ipairs(ck:names()) do info[name] = ck:info(name) end
  local layout = M.vit_pytorch_layout(info, path)
  local function shape(name)
    local i = info[name]
    if not i then error(('deepvit: %s (%s layout) has no %s'):format(path, layout, name), 0) end
    return i.shape
  end
  local channels = opts.channels or 3
  local patch_dim = shape(layout == 'current' and 'to_patch_embedding.2.weight' or 'to_patch_embedding.1.weight')[2]
  local pos = shape('pos_embedding')
  local heads = shape(layout == 'current' and 'transformer.layers.0.0.reattn_weights'
    or 'transformer.layers.0.0.fn.fn.reattn_weights')[1]
  local qkv = shape(layout == 'current' and 'transformer.layers.0.0.to_qkv.weight'
    or 'transformer.layers.0.0.fn.fn.to_qkv.weight')[1]
  local mlp = shape(layout == 'current' and 'transformer.layers.0.1.net.1.weight'
    or 'transformer.layers.0.1.fn.fn.net.0.weight')[1]
  local depth = 0
  while info[layout == 'current' and ('transformer.layers.%d.0.to_qkv.weight'):format(depth)
               or ('transformer.layers.%d.0.fn.fn.to_qkv.weight'):format(depth)] do
    depth = depth + 1
  end
  local patch = math.floor(math.sqrt(patch_dim / channels) + 0.5)
  local side = math.floor(math.sqrt(pos[2] - 1) + 0.5)
  if patch * patch * channels ~= patch_dim or side * side ~= pos[2] - 1 then
    error(('deepvit: %s: patch_dim %d and %d positions do not fit square %d-channel images (opts.channels)')
      :format(path, patch_dim, pos[2], channels), 0)
  end
  local model = M.build({
    image_size = side * patch, patch_size = patch, channels = channels, dim = pos[3], depth = depth, heads = heads,
    dim_head = qkv / 3 / heads, mlp_dim = mlp, num_classes = shape('mlp_head.1.weight')[1],
    dropout = opts.dropout or 0, emb_dropout = opts.emb_dropout or 0, patch_norm = layout == 'current',
  }, { device = opts.device, dtype = opts.dtype })
  local own, covered, unexpected = {}, {}, {}
  for _, p in ipairs(model:named_parameters()) do own[p[1]] = p[2] end
  for name, i in pairs(info) do
    local ours = M.name_from_vit_pytorch(name, layout)
    local dst = ours and own[ours]
    if not dst then
      unexpected[#unexpected + 1] = name
    elseif table.concat(i.shape, ',') ~= table.concat(dst.shape, ',') then
      error(('deepvit: %s: %s has shape [%s], the model [%s]'):format(path, name, table.concat(i.shape, ', '),
        table.concat(dst.shape, ', ')), 0)
    else
      covered[ours] = true
    end
  end
  local missing = {}
  for name in pairs(own) do if not covered[name] then missing[#missing + 1] = name end end
  if #missing > 0 or #unexpected > 0 then
    table.sort(missing)
    table.sort(unexpected)
    error(('deepvit: %s (vit-pytorch %s layout) does not fit: missing %s; unexpected %s'):format(path, layout,
      table.concat(missing, ', '), table.concat(unexpected, ', ')), 0)
  end
  for _, tensors in ck:each_file() do
    local mine = {}
    for name, t in pairs(tensors) do mine[M.name_from_vit_pytorch(name, layout)] = t end
    model:load_state_dict(mine, { strict = false })
  end
  return model, layout
end

-- What sizes it, for the bound on a config before building (common.size_of).
common.add_sizes_of('deepvit', { 'depth' },
  { 'depth', 'dim', 'heads', 'dim_head', 'mlp_dim', 'num_classes' }, M.closed_form_parameters)

return M
