/*
 * dtype.c: element types. Sizes, names and parsing; the scalar conversions
 * between f32 and the two 16-bit float formats; element load/store through
 * double and int64 (what every generic kernel uses); and fl_convert, the bulk
 * converter behind copies between dtypes, fl_to and host transfers.
 *
 * Every conversion here is correctly rounded, never "close enough":
 *   - float -> narrower float rounds to nearest, ties to even; overflow gives
 *     infinity; NaN stays a quiet NaN with its sign; -0 stays -0; f16
 *     subnormals are exact in both directions.
 *   - float -> integer truncates toward zero and saturates at the target's
 *     range; NaN becomes 0.
 *   - integer -> integer is exact where it fits and saturates where not
 *     (PyTorch wraps instead; saturation makes an out-of-range value visible
 *     as the extreme instead of an unrelated number).
 *   - anything -> bool is (x != 0), so NaN is true.
 * Mixed-precision training compares bf16/f16 results across devices and
 * ranks, so the CPU must produce exactly the bits a GPU's hardware
 * conversion produces.
 */
#include "error.h"
#include "element.h"
#include "numeric.h"
#include "cpu_isa_dispatch.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* Above this many elements the bulk loops run on all OpenMP threads; below
 * it, starting the threads costs more than the work. */
enum { FL_PARALLEL_MIN = 1 << 16 };

/* ------------------------------------------------------------------------ */
/* Names, sizes, parsing                                                     */
/* ------------------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
    bool is_float;
} dtype_info[FL_DTYPE_COUNT] = {
    [FL_F32] = {"f32", 4, true},   [FL_F64] = {"f64", 8, true},
    [FL_F16] = {"f16", 2, true},   [FL_BF16] = {"bf16", 2, true},
    [FL_I64] = {"i64", 8, false},  [FL_I32] = {"i32", 4, false},
    [FL_I16] = {"i16", 2, false},  [FL_I8] = {"i8", 1, false},
    [FL_U32] = {"u32", 4, false},  [FL_U16] = {"u16", 2, false},
    [FL_U8] = {"u8", 1, false},    [FL_BOOL] = {"bool", 1, false},
};

/* Every spelling fl_dtype_parse accepts: the canonical names first, then the
 * PyTorch/NumPy names and the C-like aliases people type in a REPL. */
static const struct {
    const char *name;
    fl_dtype dtype;
} dtype_aliases[] = {
    {"f32", FL_F32},       {"f64", FL_F64},        {"f16", FL_F16},
    {"bf16", FL_BF16},     {"i64", FL_I64},        {"i32", FL_I32},
    {"i16", FL_I16},       {"i8", FL_I8},          {"u32", FL_U32},
    {"u16", FL_U16},       {"u8", FL_U8},          {"bool", FL_BOOL},
    {"float32", FL_F32},   {"float", FL_F32},      {"float64", FL_F64},
    {"double", FL_F64},    {"float16", FL_F16},    {"half", FL_F16},
    {"bfloat16", FL_BF16}, {"int64", FL_I64},      {"long", FL_I64},
    {"int32", FL_I32},     {"int", FL_I32},        {"int16", FL_I16},
    {"short", FL_I16},     {"int8", FL_I8},        {"uint32", FL_U32},
    {"uint16", FL_U16},    {"uint8", FL_U8},       {"byte", FL_U8},
};

/* The enum's underlying type is unsigned on some compilers and signed on
 * others; comparing as unsigned rejects negatives either way. */
static inline bool dtype_valid(fl_dtype dtype) {
    return (unsigned)dtype < (unsigned)FL_DTYPE_COUNT;
}

size_t fl_dtype_size(fl_dtype dtype) {
    return dtype_valid(dtype) ? dtype_info[dtype].size : 0;
}

const char *fl_dtype_name(fl_dtype dtype) {
    return dtype_valid(dtype) ? dtype_info[dtype].name : "?";
}

bool fl_dtype_is_float(fl_dtype dtype) {
    return dtype_valid(dtype) && dtype_info[dtype].is_float;
}

int fl_dtype_parse(const char *name) {
    if (name != NULL) {
        for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++)
            if (strcmp(name, dtype_aliases[i].name) == 0) return (int)dtype_aliases[i].dtype;
    }
    fl_fail(FL_ERR_ARG,
            "unknown dtype '%s' (expected one of f32, f64, f16, bf16, i64, i32, "
            "i16, i8, u32, u16, u8, bool, or float32, float, float64, double, "
            "float16, half, bfloat16, int64, long, int32, int, int16, short, "
            "int8, uint32, uint16, uint8, byte)",
            name ? name : "(null)");
    return -1;
}

/* ------------------------------------------------------------------------ */
/* f32 <-> bf16 / f16                                                        */
/* ------------------------------------------------------------------------ */

uint16_t fl_f32_to_bf16(float value) { return fl_bf16_from_f32(value); }
float fl_bf16_to_f32(uint16_t bits) { return fl_f32_from_bf16(bits); }
uint16_t fl_f32_to_f16(float value) { return fl_f16_from_f32(value); }
float fl_f16_to_f32(uint16_t bits) { return fl_f32_from_f16(bits); }

/* ------------------------------------------------------------------------ */
/* Exact double/int64 -> 16-bit floats                                       */
/* ------------------------------------------------------------------------ */


/* ------------------------------------------------------------------------ */
/* Scalar load / store                                                       */
/* ------------------------------------------------------------------------ */

/* Float -> int64: truncate toward zero, saturate, NaN -> 0. 2^63 is exact
 * in double; anything at or beyond it in magnitude is out of range (the
 * cast would be undefined behaviour). */
static inline int64_t i64_from_f64(double d) {
    if (d != d) return 0;
    if (d >= 0x1p63) return INT64_MAX;
    if (d <= -0x1p63) return INT64_MIN;
    return (int64_t)d;
}

/* Float -> a narrower integer type whose bounds lo, hi are exact doubles. */
static inline int64_t int_from_f64(double d, double lo, double hi) {
    if (d != d) return 0;
    if (d <= lo) return (int64_t)lo;
    if (d >= hi) return (int64_t)hi;
    return (int64_t)d;
}

static inline int64_t clamp_i64(int64_t v, int64_t lo, int64_t hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* Typed access to an element at p (load_f32, store_i16, ...); memcpy keeps
 * it free of alignment and aliasing assumptions and compiles to a single
 * load or store. */
#define DEFINE_ACCESS(NAME, T)                                                 \
    static inline T load_##NAME(const void *p) {                               \
        T v;                                                                   \
        memcpy(&v, p, sizeof v);                                               \
        return v;                                                              \
    }                                                                          \
    static inline void store_##NAME(void *p, T v) { memcpy(p, &v, sizeof v); }

DEFINE_ACCESS(f32, float)
DEFINE_ACCESS(f64, double)
DEFINE_ACCESS(i64, int64_t)
DEFINE_ACCESS(i32, int32_t)
DEFINE_ACCESS(i16, int16_t)
DEFINE_ACCESS(i8, int8_t)
DEFINE_ACCESS(u32, uint32_t)
DEFINE_ACCESS(u16, uint16_t)
DEFINE_ACCESS(u8, uint8_t)

double fl_load_f64(const void *p, fl_dtype dtype) {
    switch (dtype) {
    case FL_F32: return load_f32(p);
    case FL_F64: return load_f64(p);
    case FL_F16: return fl_f32_from_f16(load_u16(p));
    case FL_BF16: return fl_f32_from_bf16(load_u16(p));
    case FL_I64: return (double)load_i64(p);
    case FL_I32: return load_i32(p);
    case FL_I16: return load_i16(p);
    case FL_I8: return load_i8(p);
    case FL_U32: return load_u32(p);
    case FL_U16: return load_u16(p);
    case FL_U8: return load_u8(p);
    case FL_BOOL: return load_u8(p) != 0;
    default: break;
    }
    fl_abort(__FILE__, __LINE__, "fl_load_f64: invalid dtype");
}

int64_t fl_load_i64(const void *p, fl_dtype dtype) {
    switch (dtype) {
    case FL_F32: return i64_from_f64(load_f32(p));
    case FL_F64: return i64_from_f64(load_f64(p));
    case FL_F16: return i64_from_f64(fl_f32_from_f16(load_u16(p)));
    case FL_BF16: return i64_from_f64(fl_f32_from_bf16(load_u16(p)));
    case FL_I64: return load_i64(p);
    case FL_I32: return load_i32(p);
    case FL_I16: return load_i16(p);
    case FL_I8: return load_i8(p);
    case FL_U32: return load_u32(p);
    case FL_U16: return load_u16(p);
    case FL_U8: return load_u8(p);
    case FL_BOOL: return load_u8(p) != 0;
    default: break;
    }
    fl_abort(__FILE__, __LINE__, "fl_load_i64: invalid dtype");
}

void fl_store_f64(void *p, fl_dtype dtype, double v) {
    switch (dtype) {
    case FL_F32: store_f32(p, v); return;
    case FL_F64: store_f64(p, v); return;
    case FL_F16: store_u16(p, fl_f16_from_f64(v)); return;
    case FL_BF16: store_u16(p, fl_bf16_from_f64(v)); return;
    case FL_I64: store_i64(p, i64_from_f64(v)); return;
    case FL_I32: store_i32(p, int_from_f64(v, INT32_MIN, INT32_MAX)); return;
    case FL_I16: store_i16(p, int_from_f64(v, INT16_MIN, INT16_MAX)); return;
    case FL_I8: store_i8(p, int_from_f64(v, INT8_MIN, INT8_MAX)); return;
    case FL_U32: store_u32(p, int_from_f64(v, 0, UINT32_MAX)); return;
    case FL_U16: store_u16(p, int_from_f64(v, 0, UINT16_MAX)); return;
    case FL_U8: store_u8(p, int_from_f64(v, 0, UINT8_MAX)); return;
    case FL_BOOL: store_u8(p, v != 0); return;
    default: break;
    }
    fl_abort(__FILE__, __LINE__, "fl_store_f64: invalid dtype");
}

/* int64 into a float type converts directly (one rounding), never through
 * double, which would round twice for |v| > 2^53. */
void fl_store_i64(void *p, fl_dtype dtype, int64_t v) {
    switch (dtype) {
    case FL_F32: store_f32(p, (float)v); return;
    case FL_F64: store_f64(p, (double)v); return;
    case FL_F16: store_u16(p, fl_f16_from_f64(fl_f64_round_odd_from_i64(v))); return;
    case FL_BF16: store_u16(p, fl_bf16_from_f64(fl_f64_round_odd_from_i64(v))); return;
    case FL_I64: store_i64(p, v); return;
    case FL_I32: store_i32(p, clamp_i64(v, INT32_MIN, INT32_MAX)); return;
    case FL_I16: store_i16(p, clamp_i64(v, INT16_MIN, INT16_MAX)); return;
    case FL_I8: store_i8(p, clamp_i64(v, INT8_MIN, INT8_MAX)); return;
    case FL_U32: store_u32(p, clamp_i64(v, 0, UINT32_MAX)); return;
    case FL_U16: store_u16(p, clamp_i64(v, 0, UINT16_MAX)); return;
    case FL_U8: store_u8(p, clamp_i64(v, 0, UINT8_MAX)); return;
    case FL_BOOL: store_u8(p, v != 0); return;
    default: break;
    }
    fl_abort(__FILE__, __LINE__, "fl_store_i64: invalid dtype");
}

/* ------------------------------------------------------------------------ */
/* Bulk conversion                                                           */
/* ------------------------------------------------------------------------ */

/* Per-element functions of the fast paths, written so each loop body is
 * straight-line code the compiler can vectorise. */
static inline double f64_from_f32(float x) { return x; }
static inline float f32_from_f64(double x) { return (float)x; }
static inline float f32_from_i32(int32_t x) { return (float)x; }
static inline float f32_from_i64(int64_t x) { return (float)x; }

static inline int32_t i32_from_f32(float x) {
    /* 2^31 is exact in float; the largest float below it is 2^31 - 128. */
    return x != x ? 0 : x >= 0x1p31f ? INT32_MAX : x <= -0x1p31f ? INT32_MIN : (int32_t)x;
}

static inline int64_t i64_from_f32(float x) {
    return x != x ? 0 : x >= 0x1p63f ? INT64_MAX : x <= -0x1p63f ? INT64_MIN : (int64_t)x;
}

/* 16-bit floats widen exactly; double narrows to them in one rounding
 * (fl_f32_round_odd). Kernels that sum in double (embedding's backward) load
 * and store bf16 rows through these. */
static inline double f64_from_bf16(uint16_t x) { return fl_f32_from_bf16(x); }
static inline double f64_from_f16(uint16_t x) { return fl_f32_from_f16(x); }

/* One contiguous loop per fast pair, compiled for each ISA level and run
 * at the one in force ([Note: ISA clones]: AVX-512 narrows 32-bit lanes
 * to 16 in one instruction, which SSE2 emulates with shuffles; f32 ->
 * bf16 ran at a third of the memory's rate on the baseline code). Large n
 * is cut into chunks of FL_PARALLEL_MIN shared among the threads, as
 * copy_bytes does below; the variant is called per chunk, outside the
 * OpenMP body. Small n (kernels convert 512-element chunks) stays on the
 * calling thread: entering even a serial `omp parallel` region costs
 * about a microsecond. */
#define DEFINE_CONVERT(NAME, DST_T, SRC_T, ELEMENT)                            \
    FL_ISA_BODY void NAME##_span_body(DST_T *restrict d,                       \
                                      const SRC_T *restrict s, int64_t n) {    \
        _Pragma("omp simd")                                                    \
        for (int64_t i = 0; i < n; i++) d[i] = ELEMENT(s[i]);                  \
    }                                                                          \
    FL_ISA_CLONES_VOID(AVX512, NAME##_span,                                    \
                       (DST_T *restrict d, const SRC_T *restrict s, int64_t n), \
                       (d, s, n))                                              \
    static void NAME(void *dst, const void *src, int64_t n) {                  \
        DST_T *d = dst;                                                        \
        const SRC_T *s = src;                                                  \
        if (n <= FL_PARALLEL_MIN) {                                            \
            NAME##_span(d, s, n);                                              \
            return;                                                            \
        }                                                                      \
        int64_t chunks = (n + FL_PARALLEL_MIN - 1) / FL_PARALLEL_MIN;          \
        _Pragma("omp parallel for schedule(static)")                           \
        for (int64_t c = 0; c < chunks; c++) {                                 \
            int64_t lo = c * FL_PARALLEL_MIN;                                  \
            NAME##_span(d + lo, s + lo,                                        \
                        n - lo < FL_PARALLEL_MIN ? n - lo : FL_PARALLEL_MIN);  \
        }                                                                      \
    }

DEFINE_CONVERT(convert_f32_to_bf16, uint16_t, float, fl_bf16_from_f32)
DEFINE_CONVERT(convert_bf16_to_f32, float, uint16_t, fl_f32_from_bf16)
DEFINE_CONVERT(convert_f32_to_f16, uint16_t, float, fl_f16_from_f32)
DEFINE_CONVERT(convert_f16_to_f32, float, uint16_t, fl_f32_from_f16)
DEFINE_CONVERT(convert_f32_to_f64, double, float, f64_from_f32)
DEFINE_CONVERT(convert_f64_to_f32, float, double, f32_from_f64)
DEFINE_CONVERT(convert_f32_to_i32, int32_t, float, i32_from_f32)
DEFINE_CONVERT(convert_i32_to_f32, float, int32_t, f32_from_i32)
DEFINE_CONVERT(convert_f32_to_i64, int64_t, float, i64_from_f32)
DEFINE_CONVERT(convert_i64_to_f32, float, int64_t, f32_from_i64)
DEFINE_CONVERT(convert_bf16_to_f64, double, uint16_t, f64_from_bf16)
DEFINE_CONVERT(convert_f64_to_bf16, uint16_t, double, fl_bf16_from_f64)
DEFINE_CONVERT(convert_f16_to_f64, double, uint16_t, f64_from_f16)
DEFINE_CONVERT(convert_f64_to_f16, uint16_t, double, fl_f16_from_f64)

static const struct {
    fl_dtype dst, src;
    void (*run)(void *dst, const void *src, int64_t n);
} fast_paths[] = {
    {FL_BF16, FL_F32, convert_f32_to_bf16}, {FL_F32, FL_BF16, convert_bf16_to_f32},
    {FL_F16, FL_F32, convert_f32_to_f16},   {FL_F32, FL_F16, convert_f16_to_f32},
    {FL_F64, FL_F32, convert_f32_to_f64},   {FL_F32, FL_F64, convert_f64_to_f32},
    {FL_I32, FL_F32, convert_f32_to_i32},   {FL_F32, FL_I32, convert_i32_to_f32},
    {FL_I64, FL_F32, convert_f32_to_i64},   {FL_F32, FL_I64, convert_i64_to_f32},
    {FL_F64, FL_BF16, convert_bf16_to_f64}, {FL_BF16, FL_F64, convert_f64_to_bf16},
    {FL_F64, FL_F16, convert_f16_to_f64},   {FL_F16, FL_F64, convert_f64_to_f16},
};

/* Same dtype: a byte copy, split into chunks so large copies use every
 * core's share of memory bandwidth. */
static void copy_bytes(void *dst, const void *src, int64_t nbytes, int64_t n) {
    if (n <= FL_PARALLEL_MIN) {
        memcpy(dst, src, (size_t)nbytes);
        return;
    }
    const int64_t chunk = 1 << 20;
    int64_t nchunks = (nbytes + chunk - 1) / chunk;
    #pragma omp parallel for if(n > FL_PARALLEL_MIN) schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t start = c * chunk;
        int64_t len = nbytes - start < chunk ? nbytes - start : chunk;
        memcpy((char *)dst + start, (const char *)src + start, (size_t)len);
    }
}

/* Every other pair, one element at a time through the scalar functions:
 * integer sources through int64 (exact, saturating at the target), float
 * sources through double (which holds every f32/f16/bf16 value exactly). */
static void convert_generic(void *dst, fl_dtype dst_dtype, const void *src,
                            fl_dtype src_dtype, int64_t n) {
    size_t dsize = fl_dtype_size(dst_dtype), ssize = fl_dtype_size(src_dtype);
    bool from_float = fl_dtype_is_float(src_dtype);
    #pragma omp parallel for if(n > FL_PARALLEL_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) { /* (the if clause: see DEFINE_CONVERT) */
        const char *s = (const char *)src + (size_t)i * ssize;
        char *d = (char *)dst + (size_t)i * dsize;
        if (from_float)
            fl_store_f64(d, dst_dtype, fl_load_f64(s, src_dtype));
        else
            fl_store_i64(d, dst_dtype, fl_load_i64(s, src_dtype));
    }
}

int fl_convert(void *dst, fl_dtype dst_dtype, const void *src, fl_dtype src_dtype,
               int64_t n) {
    if (!dtype_valid(src_dtype))
        return fl_fail(FL_ERR_ARG, "convert: invalid source dtype %d", (int)src_dtype);
    if (!dtype_valid(dst_dtype))
        return fl_fail(FL_ERR_ARG, "convert: invalid destination dtype %d", (int)dst_dtype);
    if (n < 0 || n > INT64_MAX / 8)
        return fl_fail(FL_ERR_ARG, "convert: invalid element count %lld (%s -> %s)",
                       (long long)n, fl_dtype_name(src_dtype), fl_dtype_name(dst_dtype));
    if (n == 0) return FL_OK;
    if (dst == NULL || src == NULL)
        return fl_fail(FL_ERR_ARG, "convert: NULL %s buffer for %lld elements (%s -> %s)",
                       dst == NULL ? "destination" : "source", (long long)n,
                       fl_dtype_name(src_dtype), fl_dtype_name(dst_dtype));

    if (src_dtype == dst_dtype) {
        copy_bytes(dst, src, n * (int64_t)fl_dtype_size(src_dtype), n);
        return FL_OK;
    }
    for (size_t i = 0; i < sizeof fast_paths / sizeof fast_paths[0]; i++) {
        if (fast_paths[i].dst == dst_dtype && fast_paths[i].src == src_dtype) {
            fast_paths[i].run(dst, src, n);
            return FL_OK;
        }
    }
    convert_generic(dst, dst_dtype, src, src_dtype, n);
    return FL_OK;
}
