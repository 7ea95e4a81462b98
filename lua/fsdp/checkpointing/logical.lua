-- fsdp.checkpointing.logical: where the elements of a logical (whole)
-- tensor lie when tensor parallelism splits it, and how a range of one
-- split is assembled from the pieces of another.
--
-- [Note: logical tensors in sharded checkpoints]
-- A sharded checkpoint describes every saved value against the LOGICAL
-- tensor, the one a single process without TP holds. Its index lists
-- each parameter with the logical shape and, for a TP-split parameter
-- (fsdp.tp: p.tp), tp = {dim, size, rank}: the part's flat array holds,
-- from the parameter's offset on, the rank-th of `size` slices along
-- `dim`, row-major in the slice's shape (a *layout*: {shape =, tp =}; no
-- tp: the whole tensor). A TP model's parts are one per TP rank (key
-- "unit:model.layers.0@tp1"), each sharded over its data-parallel ranks
-- as before (fsdp.checkpointing.parts: flat ranges of the part); a
-- replicated parameter is in every TP rank's part, and any copy serves.
--
-- The arithmetic: the logical tensor is viewed as a grid [R, C] (R its
-- first size, C the rest; a dim-1 split is of a matrix). Every layout
-- holds a box of the grid -- a dim-0 slice rows [t*R/T, +R/T) and every
-- column, a dim-1 slice every row and columns [t*C/T, +C/T), a whole
-- tensor all -- row-major, so a flat range [a, a+n) of a layout's array
-- (an FSDP segment: it may start and end mid-row) covers the box's local
-- rows a // c .. (a+n-1) // c. To fill such a range of the wanted layout
-- (plan), each saved layout whose box meets the wanted box on those rows
-- is read over the rows (one contiguous flat range of its array) and its
-- columns there copied into a transient block of those rows by the
-- wanted columns; the range is then the block's flat elements from
-- a - (first row) * c. A rank thus reads the rows its range touches of
-- the saved slices that hold its columns, never a whole large tensor
-- unless it wants it; the block costs its range plus at most two rows.
-- The same layout saved and wanted is one direct copy (same_layout).
local core = require 'fsdp.core'
local factories = require 'fsdp.factories'

local M = {}

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- The grid [R, C] of a logical shape.
function M.grid(shape)
  if #shape == 0 then return 1, 1 end
  local R = shape[1]
  return R, R == 0 and 0 or numel(shape) / R
end

-- The box of the grid a layout holds: row0, rows, col0, cols.
function M.box(layout)
  local R, C = M.grid(layout.shape)
  local tp = layout.tp
  if not tp or tp.size == 1 then return 0, R, 0, C end
  if tp.dim == 0 then
    local rl = R / tp.size
    return tp.rank * rl, rl, 0, C
  end
  if tp.dim ~= 1 or #layout.shape ~= 2 then
    core.fail(('checkpoint: a TP split along dim %d of a %d-d tensor is not a layout this build reads')
      :format(tp.dim, #layout.shape))
  end
  local cl = C / tp.size
  return 0, R, tp.rank * cl, cl
end

-- Elements of a layout's flat array.
function M.numel(layout)
  local _, rows, _, cols = M.box(layout)
  return rows * cols
end

-- Whether two layouts put the same elements in the same order.
function M.same_layout(a, b)
  local ar0, arl, ac0, acl = M.box(a)
  local br0, brl, bc0, bcl = M.box(b)
  return ar0 == br0 and arl == brl and ac0 == bc0 and acl == bcl
end

-- How to fill elements [first, first + n) of `want`'s flat array from the
-- `saved` layouts (a list): {rows = nrows, cols = wanted columns, skip =
-- (first - first local row * cols), reads = {{src = i (index in saved),
-- first =, n = (the flat range of saved[i]'s array to read), rows = (its
-- rows), cols = (its columns), take_col = (first column of the read used),
-- at_row =, at_col = (where it lands in the block), ncols =}...}}. Fails
-- unless the saved layouts cover the block exactly once.
function M.plan(want, first, n, saved, what)
  local wr0, _, wc0, wcl = M.box(want)
  local lr0 = math.floor(first / wcl)
  local lr1 = math.floor((first + n - 1) / wcl) + 1
  local g0, g1 = wr0 + lr0, wr0 + lr1 -- the global rows touched
  local out = { rows = lr1 - lr0, cols = wcl, skip = first - lr0 * wcl, reads = {} }
  local covered = 0
  for i, s in ipairs(saved) do
    local sr0, srl, sc0, scl = M.box(s)
    local h0, h1 = math.max(g0, sr0), math.min(g1, sr0 + srl)
    local k0, k1 = math.max(wc0, sc0), math.min(wc0 + wcl, sc0 + scl)
    if h0 < h1 and k0 < k1 then
      out.reads[#out.reads + 1] = { src = i, first = (h0 - sr0) * scl, n = (h1 - h0) * scl, rows = h1 - h0,
                                    cols = scl, take_col = k0 - sc0, at_row = h0 - g0, at_col = k0 - wc0,
                                    ncols = k1 - k0 }
      covered = covered + (h1 - h0) * (k1 - k0)
    end
  end
  if covered ~= out.rows * out.cols then
    core.fail(('checkpoint: %s: the saved slices cover %d of the %d elements wanted (a TP slice missing, or '
      .. 'saved twice)'):format(what or 'a tensor', covered, out.rows * out.cols))
  end
  return out
end

-- Fill dst (1-d, n elements) with elements [first, first + n) of `want`'s
-- array, reading saved layouts through read(i, first, m, into): copy
-- elements [first, first + m) of saved[i]'s array into the 1-d tensor
-- `into`. The transient block is dst's dtype.
function M.assemble(want, first, dst, saved, read, what)
  local n = dst:numel()
  if n == 0 then return end
  local p = M.plan(want, first, n, saved, what)
  if #p.reads == 1 and p.rows * p.cols == n and p.reads[1].ncols == p.reads[1].cols then
    -- one saved run lands as it is: read straight into dst
    local r = p.reads[1]
    read(r.src, r.first, r.n, dst)
    return
  end
  local block = factories.empty({ p.rows, p.cols }, { dtype = dst.dtype })
  for _, r in ipairs(p.reads) do
    local tmp = factories.empty({ r.n }, { dtype = dst.dtype })
    read(r.src, r.first, r.n, tmp)
    local piece = tmp:view({ r.rows, r.cols }):narrow(1, r.take_col, r.ncols)
    block:narrow(0, r.at_row, r.rows):narrow(1, r.at_col, r.ncols):copy_(piece)
    tmp:free()
  end
  dst:copy_(block:view({ p.rows * p.cols }):narrow(0, p.skip, n))
  block:free()
end

M.numel_of = numel

return M
