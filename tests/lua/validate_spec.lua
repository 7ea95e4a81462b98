-- validate_spec.lua: fsdp.validate, the numeric check every validation
-- shares (issue 38): NaN and infinity fail every rule, integers stop at
-- 2^53, and values are shown as a file holds them, never "table: 0x...".
local validate = require 'fsdp.validate'
local json = require 'fsdp.io.json'

describe('fsdp.validate', function()
  it('refuses NaN under every rule, infinity unless a rule allows it', function()
    local nan, inf = 0 / 0, math.huge
    for _, rule in ipairs({ {}, validate.POSITIVE, validate.NONNEGATIVE, validate.PROBABILITY, validate.COUNT,
                            { max = 1 }, { below = 1 }, { nonfinite = true } }) do
      assert.equals('must be a finite number, got nan', validate.problem(nan, rule))
      assert.equals('must be a finite number, got nan', validate.problem(-nan, rule))
    end
    assert.equals('must be a finite number, got inf', validate.problem(inf, validate.POSITIVE))
    assert.equals('must be a finite number, got -inf', validate.problem(-inf, { max = 0 }))
    assert.is_nil(validate.problem(inf, { nonfinite = true, positive = true }))
  end)

  it('takes an integer as a count only while a double holds every integer up to it', function()
    assert.is_nil(validate.problem(2 ^ 53, validate.COUNT))
    assert.equals('must be an integer of at most 2^53 (a count a double holds exactly), got 1e+300',
      validate.problem(1e300, validate.COUNT))
    assert.equals('must be an integer, got 2.5', validate.problem(2.5, validate.COUNT))
    assert.equals('must be >= 1, got 0', validate.problem(0, validate.COUNT))
    -- 1e12 is a count (what it costs is the fit check's business)
    assert.is_nil(validate.problem(1e12, validate.COUNT))
  end)

  it('says what is missing or of another type', function()
    assert.equals('is missing', validate.problem(nil, validate.COUNT))
    assert.equals('must be a number, got "64"', validate.problem('64', validate.COUNT))
    assert.equals('must be a number, got {"a": [1, 2]}', validate.problem({ a = { 1, 2 } }, {}))
    assert.equals('must be a number, got null', validate.problem(json.null, {}))
    assert.equals('must be < 1, got 1', validate.problem(1, validate.PROBABILITY))
    assert.equals('must be > 0, got 0', validate.problem(0, validate.POSITIVE))
    assert.equals('must be <= 1, got 1.5', validate.problem(1.5, { max = 1 }))
  end)

  it('shows nested values as JSON, long ones cut', function()
    assert.equals('{"factor": {"a": 1}, "type": "llama3"}', validate.show({ factor = { a = 1 }, type = 'llama3' }))
    assert.equals('[nan, inf, 1000000000000, 1e+300]', validate.show({ 0 / 0, math.huge, 1e12, 1e300 }))
    local long = validate.show({ string.rep('x', 200) })
    assert.is_true(#long <= 83, long)
    assert.equals('...', long:sub(-3))
  end)

  it('check raises one line naming the thing, without a location', function()
    local ok, err = pcall(validate.check, 0 / 0, validate.POSITIVE, 'LoRA: alpha')
    assert.is_false(ok)
    assert.equals('LoRA: alpha must be a finite number, got nan', err)
    assert.equals(3, validate.check(3, validate.COUNT, 'x'))
  end)
end)
