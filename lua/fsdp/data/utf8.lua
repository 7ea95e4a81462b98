-- fsdp.data.utf8: where a Lua string stops being valid UTF-8, for the data
-- paths read in Lua (tools/tokenize.lua's text files, fsdp.data.pairs'
-- JSONL); the core's readers check their own input in C (core/data/reader.c).
-- Valid means the Unicode standard's table (no overlong forms, no
-- surrogates, nothing past U+10FFFF), the rule the C reader applies.
--
--   local utf8 = require 'fsdp.data.utf8'
--   local at = utf8.first_invalid(text)   -- 1-based byte of the first bad byte, or nil
local M = {}

-- Each well-formed multi-byte sequence, by length. The passes run C string
-- matching (no per-byte Lua): each valid sequence is overwritten with as
-- many ASCII bytes, so byte positions stay those of the input and what
-- still has its high bit set is a byte no valid sequence covers. Lead
-- bytes and continuation bytes are disjoint ranges, so no match can start
-- inside another sequence.
local SEQUENCES = {
  { '\240[\144-\191][\128-\191][\128-\191]', 'xxxx' },
  { '[\241-\243][\128-\191][\128-\191][\128-\191]', 'xxxx' },
  { '\244[\128-\143][\128-\191][\128-\191]', 'xxxx' },
  { '\224[\160-\191][\128-\191]', 'xxx' },
  { '[\225-\236\238\239][\128-\191][\128-\191]', 'xxx' },
  { '\237[\128-\159][\128-\191]', 'xxx' },
  { '[\194-\223][\128-\191]', 'xx' },
}

-- The 1-based position of the first byte of s that is not part of valid
-- UTF-8, or nil when s is valid.
function M.first_invalid(s)
  if not s:find('[\128-\255]') then return nil end
  for _, p in ipairs(SEQUENCES) do s = s:gsub(p[1], p[2]) end
  return (s:find("[\128-\255]"))
end

return M
