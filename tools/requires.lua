-- tools/requires.lua: the Lua require graph of the library (lua/fsdp) and
-- the models (models/), read from the source, and the rule
-- docs/ARCHITECTURE.md ("Lua layers") states about it: no circle between
-- files, whether a require sits at the top of a file or inside a function
-- (a lazy require is still a dependency; it only moves when it is paid).
-- Prints the counts (modules, edges, circles, requires inside functions),
-- each circle, and with --lazy each require inside a function with the
-- comment line above it; exits non-zero when there is a circle.
--
-- A require stays inside a function only for a reason, given in a comment
-- that starts `-- lazy:` on the line above it or at the end of its line
-- (start-up time, an optional load through pcall, a circle it would
-- close); one without is listed and makes the exit non-zero too.
--
--   luajit tools/requires.lua [--lazy] [--named]   (or fsdp-lua tools/requires.lua)
--
-- A require is `require 'm'`, `require "m"`, `require('m')` or
-- `pcall(require, 'm')` with a literal name; names built at run time
-- (require('models.families.' .. name)) are counted as dynamic and make no
-- edge; with --named, a file with one also depends on every module it
-- names in a string literal (a list of modules it loads: the fsdp facade's
-- submodules loaded on first use); the rule holds with --named too
-- (docs/ARCHITECTURE.md, "Lua layers"). Such names are no requires: they
-- count as edges, not as requires inside functions. The reader knows
-- Lua's strings and comments, and counts a require as inside a function
-- when a `function` block is open around it.
local show_lazy, with_named = false, false
for _, a in ipairs(arg) do
  if a == '--lazy' then show_lazy = true end
  if a == '--named' then with_named = true end
end

local function lines(cmd)
  local f = assert(io.popen(cmd .. ' 2>/dev/null'))
  local out = {}
  for l in f:lines() do out[#out + 1] = l end
  f:close()
  return out
end

-- Module name of a file: lua/fsdp/x/init.lua -> fsdp.x, models/a/b.lua -> models.a.b.
local function module_of(path)
  local p = path:gsub('^lua/', ''):gsub('%.lua$', ''):gsub('/init$', '')
  return (p:gsub('/', '.'))
end

local files = lines('find lua/fsdp models -name "*.lua"')
table.sort(files)
local file_of = {}
for _, f in ipairs(files) do file_of[module_of(f)] = f end

-- The tokens of a Lua source that matter here: names, string literals
-- (as {str = ...}), and punctuation; comments dropped. Line numbers kept.
local function tokens(src)
  local out, i, n, line = {}, 1, #src, 1
  local function long_close(level, from)
    local close = ']' .. ('='):rep(level) .. ']'
    local e = src:find(close, from, true)
    return e and e + #close - 1 or n
  end
  while i <= n do
    local c = src:sub(i, i)
    if c == '\n' then
      line = line + 1; i = i + 1
    elseif c:match('%s') then
      i = i + 1
    elseif src:sub(i, i + 1) == '--' then
      local lvl = src:match('^%[(=*)%[', i + 2)
      local e
      if lvl then e = long_close(#lvl, i + 4 + #lvl) else e = (src:find('\n', i, true) or n + 1) - 1 end
      for _ in src:sub(i, e):gmatch('\n') do line = line + 1 end
      i = e + 1
    elseif c == '"' or c == "'" then
      local j, buf = i + 1, {}
      while j <= n do
        local d = src:sub(j, j)
        if d == '\\' then buf[#buf + 1] = src:sub(j, j + 1); j = j + 2
        elseif d == c then break
        else
          if d == '\n' then line = line + 1 end
          buf[#buf + 1] = d; j = j + 1
        end
      end
      out[#out + 1] = { str = table.concat(buf), line = line }
      i = j + 1
    elseif c == '[' and src:match('^%[=*%[', i) then
      local lvl = #src:match('^%[(=*)%[', i)
      local e = long_close(lvl, i + 2 + lvl)
      local body = src:sub(i + 2 + lvl, e - 2 - lvl)
      out[#out + 1] = { str = body, line = line }
      for _ in src:sub(i, e):gmatch('\n') do line = line + 1 end
      i = e + 1
    elseif c:match('[%a_]') then
      local w = src:match('^[%w_]+', i)
      out[#out + 1] = { word = w, line = line }
      i = i + #w
    elseif c:match('%d') then
      local w = src:match('^[%w_%.]+', i)
      i = i + #w
    else
      out[#out + 1] = { punct = c, line = line }
      i = i + 1
    end
  end
  return out
end

-- Requires of one file: {{name=, line=, lazy=bool}...}, the dynamic count,
-- the source, and the lines of dynamic requires inside functions.
local function requires_of(path)
  local f = assert(io.open(path))
  local src = f:read('*a')
  f:close()
  local toks = tokens(src)
  local stack, fn_depth, out, dynamic, named, dynamic_lazy = {}, 0, {}, 0, {}, {}
  local skip_do = 0 -- `while`/`for` open their block at their `do`
  for k, t in ipairs(toks) do
    local w = t.word
    if w == 'function' then
      stack[#stack + 1] = 'function'; fn_depth = fn_depth + 1
    elseif w == 'if' or w == 'repeat' then
      stack[#stack + 1] = w
    elseif w == 'while' or w == 'for' then
      stack[#stack + 1] = w; skip_do = skip_do + 1
    elseif w == 'do' then
      if skip_do > 0 then skip_do = skip_do - 1 else stack[#stack + 1] = 'do' end
    elseif w == 'end' or w == 'until' then
      local top = table.remove(stack)
      if top == 'function' then fn_depth = fn_depth - 1 end
    elseif w == 'require' then
      -- require 'x' | require('x') | pcall(require, 'x')
      local a, b = toks[k + 1], toks[k + 2]
      local name
      if a and a.str then name = a.str
      elseif a and (a.punct == '(' or a.punct == ',') and b and b.str then
        local after = toks[k + 3]
        if after and after.punct == '.' then dynamic = dynamic + 1 else name = b.str end
      elseif a and (a.punct == '(' or a.punct == ',') then
        dynamic = dynamic + 1
        if fn_depth > 0 then dynamic_lazy[#dynamic_lazy + 1] = t.line end
      end
      if not name and fn_depth > 0 and a and b and b.str and toks[k + 3] and toks[k + 3].punct == '.' then
        dynamic_lazy[#dynamic_lazy + 1] = t.line
      end
      if name then out[#out + 1] = { name = name, line = t.line, lazy = fn_depth > 0 } end
    elseif t.str and file_of[t.str] then
      named[#named + 1] = { name = t.str, line = t.line, lazy = false, named = true }
    end
  end
  -- With --named, a file that requires names it computes (a list of
  -- modules it loads) depends on every module it names in a string.
  if dynamic > 0 and with_named then
    for _, r in ipairs(named) do out[#out + 1] = r end
  end
  if #stack ~= 0 then io.stderr:write(('requires.lua: %s: %d block(s) left open (a reading error)\n'):format(path, #stack)) end
  return out, dynamic, src, dynamic_lazy
end

-- The reason a require inside a function gives: `-- lazy: ...` on its
-- line or the line above.
local function reason(src_lines, line)
  for _, l in ipairs({ src_lines[line] or '', src_lines[line - 1] or '' }) do
    local why = l:match('%-%-%s*lazy:%s*(.-)%s*$')
    if why and why ~= '' then return why end
  end
end

local edges, n_edges, n_lazy, n_dynamic, lazy_list, unexplained = {}, 0, 0, 0, {}, {}
for _, f in ipairs(files) do
  local m = module_of(f)
  edges[m] = edges[m] or {}
  local reqs, dynamic, src, dynamic_lazy = requires_of(f)
  n_dynamic = n_dynamic + dynamic
  local src_lines
  for _, line in ipairs(dynamic_lazy) do
    src_lines = src_lines or lines("cat " .. f)
    if not reason(src_lines, line) then unexplained[#unexplained + 1] = ('%s:%d (a computed name)'):format(f, line) end
  end
  for _, r in ipairs(reqs) do
    if file_of[r.name] and r.name ~= m then
      if not edges[m][r.name] then n_edges = n_edges + 1 end
      edges[m][r.name] = edges[m][r.name] or r
      if r.lazy then
        n_lazy = n_lazy + 1
        src_lines = src_lines or lines("cat " .. f)
        local why = reason(src_lines, r.line)
        if not why then unexplained[#unexplained + 1] = ('%s:%d %s'):format(f, r.line, r.name) end
        if show_lazy then
          lazy_list[#lazy_list + 1] = ('%s:%d %s\n    lazy: %s\n    %s'):format(f, r.line, r.name,
            why or '(no reason given)', (src_lines[r.line] or ''):match('^%s*(.-)$'))
        end
      end
    end
  end
end

-- Circles: the strongly connected components of more than one module (Tarjan).
local index, low, on_stack, stack, comps, counter = {}, {}, {}, {}, {}, 0
local names = {}
for m in pairs(edges) do names[#names + 1] = m end
table.sort(names)
local function strong(v)
  counter = counter + 1
  index[v], low[v] = counter, counter
  stack[#stack + 1] = v; on_stack[v] = true
  local targets = {}
  for w in pairs(edges[v]) do targets[#targets + 1] = w end
  table.sort(targets)
  for _, w in ipairs(targets) do
    if not index[w] then
      strong(w)
      low[v] = math.min(low[v], low[w])
    elseif on_stack[w] then
      low[v] = math.min(low[v], index[w])
    end
  end
  if low[v] == index[v] then
    local comp = {}
    repeat
      local w = table.remove(stack)
      on_stack[w] = false
      comp[#comp + 1] = w
    until w == v
    if #comp > 1 then table.sort(comp); comps[#comps + 1] = comp end
  end
end
for _, m in ipairs(names) do if not index[m] then strong(m) end end

-- One shortest loop inside a component, to show what to cut.
local function loop_in(comp)
  local inside = {}
  for _, m in ipairs(comp) do inside[m] = true end
  local best
  for _, start in ipairs(comp) do
    local prev, queue, head = { [start] = false }, { start }, 1
    local found
    while head <= #queue and not found do
      local v = queue[head]; head = head + 1
      local ts = {}
      for w in pairs(edges[v]) do ts[#ts + 1] = w end
      table.sort(ts)
      for _, w in ipairs(ts) do
        if w == start then found = v; break end
        if inside[w] and prev[w] == nil then prev[w] = v; queue[#queue + 1] = w end
      end
    end
    if found then
      local path, v = { start }, found
      local rev = {}
      while v ~= start do rev[#rev + 1] = v; v = prev[v] end
      for j = #rev, 1, -1 do path[#path + 1] = rev[j] end
      path[#path + 1] = start
      if not best or #path < #best then best = path end
    end
  end
  return best
end

local in_circles = 0
for _, comp in ipairs(comps) do
  in_circles = in_circles + #comp
  print(('circle of %d modules: %s'):format(#comp, table.concat(comp, ' ')))
  local l = loop_in(comp)
  local parts = {}
  for j = 1, #l - 1 do
    local r = edges[l[j]][l[j + 1]]
    parts[#parts + 1] = ('%s -(%s:%d%s)->'):format(l[j], file_of[l[j]], r.line, r.lazy and ', in a function' or '')
  end
  print('  e.g. ' .. table.concat(parts, ' ') .. ' ' .. l[#l])
  if os.getenv('REQUIRES_EDGES') then
    local inside = {}
    for _, m in ipairs(comp) do inside[m] = true end
    for _, m in ipairs(comp) do
      for w, r in pairs(edges[m]) do
        if inside[w] then print(('    %s -> %s (%s:%d%s)'):format(m, w, file_of[m], r.line, r.lazy and ', lazy' or '')) end
      end
    end
  end
end
if show_lazy then
  print('requires inside functions:')
  for _, s in ipairs(lazy_list) do print('  ' .. s) end
end
for _, u in ipairs(unexplained) do
  print(('require inside a function with no `-- lazy:` reason above it: %s'):format(u))
end
print(('%d modules, %d edges, %d circle(s) (%d modules in them), %d require(s) inside functions (%d without a reason), '
  .. '%d dynamic'):format(#names, n_edges, #comps, in_circles, n_lazy, #unexplained, n_dynamic))
os.exit((#comps == 0 and #unexplained == 0) and 0 or 1)
