-- options_doc_spec.lua: docs/options.md is what tools/options_doc.lua
-- writes from the recipes' --help today, so the page of every option
-- cannot drift from the options (a changed option fails here until the
-- page is written again); and --check catches a page edited by hand.
local T = require 'fsdp.testing'
local host = require 'fsdp.host'
local files = require 'fsdp.io.files'

describe('docs/options.md', function()
  it('is what tools/options_doc.lua writes from every recipe', function()
    local out, rc = T.run_script('tools/options_doc.lua', '--check', 120)
    assert.are.equal(0, rc, out)
    local page = files.read(host.root .. '/docs/options.md')
    for _, r in ipairs(require('fsdp.options').recipes(host.root)) do
      assert.truthy(page:find('\n## ' .. r.path .. '\n', 1, true), r.path .. ' has no section')
    end
    assert.truthy(page:find('--max_steps', 1, true))
  end)

  it('--check names the first line that differs from the recipes', function()
    local page = files.read(host.root .. '/docs/options.md')
    local tmp = os.tmpname()
    local f = assert(io.open(tmp, 'wb'))
    f:write((page:gsub('%-%-max_steps   ', '--max_stepz   ', 1)))
    f:close()
    local out, rc = T.run_script('tools/options_doc.lua', '--check --out=' .. T.quote(tmp), 120)
    os.remove(tmp)
    assert.are.equal(1, rc, out)
    assert.truthy(out:find('is stale at line %d+: it has ".*%-%-max_stepz'), out)
  end)
end)
