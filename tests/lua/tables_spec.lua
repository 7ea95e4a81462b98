-- tables_spec.lua: fsdp.tables, the sorted-keys helper the library shares
-- (recipe options, checkpoints, the REPL, chat templates, optimizers).
local tables = require 'fsdp.tables'

describe('fsdp.tables.sorted_keys', function()
  it('lists the keys of a table in order, strings or numbers', function()
    assert.same({ 'a', 'b', 'lr', 'z' }, tables.sorted_keys({ z = 1, lr = 2, a = 3, b = false }))
    assert.same({ 1, 2, 10 }, tables.sorted_keys({ [10] = 'x', [2] = 'y', [1] = 'z' }))
    assert.same({}, tables.sorted_keys({}))
  end)

  it('orders mixed keys by their text with by_string, and takes any order given', function()
    assert.same({ 1, 10, 2, 'a' }, tables.sorted_keys({ a = 1, [2] = 1, [10] = 1, [1] = 1 }, tables.by_string))
    assert.same({ 'c', 'b', 'a' }, tables.sorted_keys({ a = 1, b = 1, c = 1 }, function(x, y) return x > y end))
    -- (Lua cannot order a number against a string on its own)
    assert.has_error(function() tables.sorted_keys({ a = 1, [2] = 1 }) end)
  end)
end)
