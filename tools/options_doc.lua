-- tools/options_doc.lua: docs/options.md, every option of every recipe, made
-- from the recipes themselves: each recipe `fsdp-lua --list` names is run
-- with `--help` (the option spec's own text: default, description, checks,
-- aliases), and its output is written under the recipe's name. Nothing is
-- written by hand, so the page is as true as `--help`; tests/lua/options_doc_spec.lua
-- fails when the committed page differs from what this writes (run this
-- again after changing an option).
--
--   fsdp-lua tools/options_doc.lua            write docs/options.md
--   fsdp-lua tools/options_doc.lua --check    exit 1, naming the first difference, when it is stale
--   fsdp-lua tools/options_doc.lua --out=FILE write FILE instead
local host = require 'fsdp.host'
local quote = require 'fsdp.quote'
local options = require 'fsdp.options'

local out_path, check = host.root .. '/docs/options.md', false
for _, a in ipairs(arg) do
  if a == '--check' then check = true
  elseif a:match('^%-%-out=') then out_path = a:match('^%-%-out=(.*)$')
  else
    io.stderr:write(('fsdp-lua: tools/options_doc.lua: %s is not an option (--check, --out=FILE)\n'):format(a))
    os.exit(2)
  end
end

local parts = {
  '# Every option of every recipe',
  '',
  '<!-- Written by tools/options_doc.lua from each recipe\'s --help: do not edit by hand. -->',
  '',
  'Each recipe\'s `--help`, as it prints it: the option, its default, what it',
  'does and, in brackets, what is checked before anything is built; an',
  '`alias` line is another name the option takes (the seed\'s and PyTorch',
  'FSDP2\'s names). This page is generated (`fsdp-lua tools/options_doc.lua`)',
  'and the `lua` suite fails when it differs from the recipes',
  '(tests/lua/options_doc_spec.lua), so it stays what `--help` says. Options',
  'go on the command line (`--key=value`, `--key value`, `--flag`,',
  '`--no-flag`) or in a `--config` file ([Training](training.md)).',
  '',
}
local list = options.recipes(host.root)
for _, r in ipairs(list) do
  parts[#parts + 1] = ('- [%s](#%s): %s'):format(r.path, r.path:gsub('[^%w _%-]', ''):lower(), r.summary)
end
for _, r in ipairs(list) do
  local text, rc = quote.capture({ 'sh', '-c', 'cd "$1" && exec "$2" "$3" --help', 'sh', host.root, host.exe,
    r.path })
  if rc ~= 0 then
    io.stderr:write(('fsdp-lua: tools/options_doc.lua: %s --help exited %d:\n%s\n'):format(r.path, rc, text))
    os.exit(1)
  end
  parts[#parts + 1] = ''
  parts[#parts + 1] = '## ' .. r.path
  parts[#parts + 1] = ''
  parts[#parts + 1] = r.summary .. '.'
  parts[#parts + 1] = ''
  parts[#parts + 1] = '```text'
  parts[#parts + 1] = (text:gsub('%s+$', ''))
  parts[#parts + 1] = '```'
end
local page = table.concat(parts, '\n') .. '\n'

if check then
  local f = io.open(out_path, 'rb')
  local old = f and f:read('*a') or ''
  if f then f:close() end
  if old == page then print(('%s: up to date'):format(out_path)) os.exit(0) end
  local n = 0
  local new_lines = {}
  for l in page:gmatch('([^\n]*)\n') do new_lines[#new_lines + 1] = l end
  for l in (old .. (old:sub(-1) == '\n' and '' or '\n')):gmatch('([^\n]*)\n') do
    n = n + 1
    if l ~= new_lines[n] then
      io.stderr:write(('%s is stale at line %d: it has %q, the recipes say %q; run fsdp-lua tools/options_doc.lua\n')
        :format(out_path, n, l, new_lines[n] or '(end of page)'))
      os.exit(1)
    end
  end
  io.stderr:write(('%s is stale at line %d (the recipes say more); run fsdp-lua tools/options_doc.lua\n')
    :format(out_path, n + 1))
  os.exit(1)
end
local f = assert(io.open(out_path, 'wb'))
f:write(page)
f:close()
print(('wrote %s: %d recipes'):format(out_path, #list))
