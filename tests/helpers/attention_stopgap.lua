-- tests/helpers/attention_stopgap.lua: a test-only stand-in for the
-- sliding window and logit softcap of nn.Attention (h-attn's options
-- window = W, softcap = c), so the family goldens can be checked on a
-- build that lacks them. It materialises the scores and a dense bool mask
-- in Lua ops: fine for 9-token goldens, never for a model. With the real
-- options present, install() does nothing.
--
--   local stopgap = require 'tests.helpers.attention_stopgap'
--   local restore = stopgap.install()   -- nil when nn.Attention has the options
--   ... build and run models ...
--   if restore then restore() end
local fsdp = require 'fsdp'
local nn = require 'fsdp.nn'

local M = {}

-- Whether nn.Attention keeps window and softcap itself.
function M.native()
  local ok, a = pcall(nn.Attention, 8, 2, { window = 2, softcap = 3, device = 'meta' })
  return ok and a.window == 2 and a.softcap == 3
end

-- softmax(softcap(scale q k^T) masked) v, grouped heads broadcast.
local function attend(F, q, k, v, scale, softcap, keep)
  local B, H, T, hd = q:size(0), q:size(1), q:size(2), q:size(3)
  local KV, S, Dv = k:size(1), k:size(2), v:size(3)
  local rep = H / KV
  local s = F.matmul(q:reshape(B, KV, rep, T, hd), k:unsqueeze(2):transpose(3, 4)) * scale
  s = s:view(B, H, T, S)
  if softcap then s = F.tanh(s / softcap) * softcap end
  -- (a finite floor, as transformers' eager attention: a query with no
  -- visible key, a padding position, gets finite values, not NaN)
  s = F.where(keep, s, -1e30)
  return F.matmul(F.softmax(s, -1):view(B, KV, rep, T, S), v:unsqueeze(2)):view(B, H, T, Dv)
end

function M.install()
  if M.native() then return nil end
  local init, forward = nn.Attention.__init, nn.Attention.forward
  nn.Attention.__init = function(self, dim, n_heads, opts)
    local o = {}
    for k, v in pairs(opts or {}) do o[k] = v end
    local window, softcap = o.window, o.softcap
    o.window, o.softcap = nil, nil
    init(self, dim, n_heads, o)
    self.window, self.softcap = window, softcap
  end
  nn.Attention.forward = function(self, x, opts)
    if not self.window and not self.softcap then return forward(self, x, opts) end
    opts = opts or {}
    local F = require 'fsdp.functional'
    local B, T = x:size(0), x:size(1)
    local q, k, v = self:project(x)
    if opts.rope then
      local ropts = opts.rope.positions and { positions = opts.rope.positions } or nil
      q = F.apply_rotary(q, opts.rope.cos, opts.rope.sin, ropts)
      k = F.apply_rotary(k, opts.rope.cos, opts.rope.sin, ropts)
    end
    if opts.kv_cache then k, v = opts.kv_cache:update(k, v) end
    local S = k:size(2)
    -- queries at positions S-T ... S-1 (bottom-right: the cache's newest)
    local rows = fsdp.arange(T, { dtype = 'i64', device = q.device }):view(T, 1) + (S - T)
    local cols = fsdp.arange(S, { dtype = 'i64', device = q.device }):view(1, S)
    local keep = F.le(cols, rows)
    if self.window then keep = F.where(F.gt(cols, rows - self.window), keep, false) end
    keep = keep:view(1, 1, T, S)
    if opts.mask ~= nil then keep = F.where(opts.mask, keep, false) end
    local o = attend(F, q, k, v, self.scale, self.softcap, keep)
    return self[self._names.o](o:transpose(1, 2):reshape(B, T, self.n_heads * self.head_dim))
  end
  return function() nn.Attention.__init, nn.Attention.forward = init, forward end
end

return M
