/*
 * checksum.c: the integrity of checkpoint data: an XXH3-64 checksum
 * (Debian's libxxhash) of the bytes of a file's tensor data, and a scan for
 * NaN and infinity, in one pass over the bytes as they are written.
 *
 * XXH3 rather than CRC32C: it runs at memory speed with SSE2/AVX2 (tens of
 * GB/s per core in cache) and over blocks on every core (the Note below),
 * so verifying a file costs less than reading it (benchmarks/checksum.lua), and 64 bits make an undetected random corruption
 * of a checkpoint practically impossible. The checksum detects damage; it
 * is not a signature (anyone may recompute it).
 *
 * The finiteness scan reads the exponent bits only (all ones: NaN or
 * infinity) with an OR-reduction the compiler vectorises, and it runs on
 * the same cache-sized block just before the block is hashed, so the data
 * is brought from memory once for both.
 */
#include "error.h"

#include <stdlib.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t by value */
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
/* Debian's libxxhash picks the widest vectors the CPU has (SSE2, AVX2,
 * AVX-512) at run time through these entry points. */
#include <xxh_x86dispatch.h>
#define HASH_UPDATE XXH3_64bits_update_dispatch
#define HASH_ONESHOT XXH3_64bits_dispatch
#else
#define HASH_UPDATE XXH3_64bits_update
#define HASH_ONESHOT XXH3_64bits
#endif

/* [Note: the checksum of a file's data]
 * The data is cut into blocks of FL_CHECKSUM_BLOCK bytes (the last may be
 * shorter; no block for no data); the checksum is XXH3-64 of the blocks'
 * XXH3-64 values, each as 8 little-endian bytes. One hash of the whole
 * would tie verification to one core; with blocks a reader hashes them on
 * every core (OpenMP) and keeps up with a parallel read, while the writer
 * streams through them in order at no extra cost. */
struct fl_digest {
    XXH3_state_t outer, block;
    uint64_t in_block; /* bytes of the current block hashed so far */
};

static void put_le64(unsigned char out[8], uint64_t v) {
    for (int k = 0; k < 8; k++) out[k] = (unsigned char)(v >> (8 * k));
}

fl_digest *fl_digest_new(void) {
    fl_digest *d = aligned_alloc(64, (sizeof(fl_digest) + 63) / 64 * 64);
    if (!d) return FL_FAIL_NULL(FL_ERR_OOM, "checksum: out of memory");
    fl_digest_reset(d);
    return d;
}

void fl_digest_free(fl_digest *d) { free(d); }

void fl_digest_reset(fl_digest *d) {
    if (!d) return;
    XXH3_64bits_reset(&d->outer);
    XXH3_64bits_reset(&d->block);
    d->in_block = 0;
}

/* Hash bytes into the current blocks, closing each full one. */
static void digest_bytes(fl_digest *d, const char *p, size_t n) {
    while (n > 0) {
        size_t k = FL_CHECKSUM_BLOCK - d->in_block;
        if (k > n) k = n;
        HASH_UPDATE(&d->block, p, k);
        d->in_block += k;
        p += k;
        n -= k;
        if (d->in_block == FL_CHECKSUM_BLOCK) {
            unsigned char le[8];
            put_le64(le, XXH3_64bits_digest(&d->block));
            XXH3_64bits_update(&d->outer, le, 8);
            XXH3_64bits_reset(&d->block);
            d->in_block = 0;
        }
    }
}

/* Whether any element has an all-ones exponent; `bits` selects it. The
 * loop has no early exit so that it vectorises; a block is small. */
#define ANY_NONFINITE(T, EXP)                                                          \
    static __attribute__((optimize("O3"))) bool any_nonfinite_##T(const T *x, size_t n) { \
        T acc = 0;                                                                     \
        for (size_t i = 0; i < n; i++) acc |= (T)((x[i] & (EXP)) == (EXP));            \
        return acc != 0;                                                               \
    }
ANY_NONFINITE(uint16_t, (uint16_t)0x7c00) /* f16 */
ANY_NONFINITE(uint32_t, 0x7f800000u)      /* f32 */
ANY_NONFINITE(uint64_t, 0x7ff0000000000000ull)

static bool block_nonfinite(const void *p, size_t n, fl_dtype dtype) {
    switch (dtype) {
    case FL_F32: return any_nonfinite_uint32_t(p, n);
    case FL_F64: return any_nonfinite_uint64_t(p, n);
    case FL_F16: return any_nonfinite_uint16_t(p, n);
    case FL_BF16: { /* bf16 is the top half of an f32: exponent 0x7f80 */
        const uint16_t *x = p;
        uint16_t acc = 0;
        for (size_t i = 0; i < n; i++) acc |= (uint16_t)((x[i] & 0x7f80) == 0x7f80);
        return acc != 0;
    }
    default: return false;
    }
}

static bool element_nonfinite(const void *p, int64_t i, fl_dtype dtype) {
    return block_nonfinite((const char *)p + i * (int64_t)fl_dtype_size(dtype), 1, dtype);
}

int64_t fl_first_nonfinite(const void *data, int64_t n, fl_dtype dtype) {
    if (!data || n <= 0 || !fl_dtype_is_float(dtype)) return -1;
    size_t es = fl_dtype_size(dtype);
    enum { BLOCK = 1 << 14 };
    for (int64_t at = 0; at < n; at += BLOCK) {
        int64_t m = n - at < BLOCK ? n - at : BLOCK;
        const char *p = (const char *)data + at * (int64_t)es;
        if (!block_nonfinite(p, (size_t)m, dtype)) continue;
        for (int64_t i = 0; i < m; i++)
            if (element_nonfinite(p, i, dtype)) return at + i;
    }
    return -1;
}

int64_t fl_digest_update(fl_digest *d, const void *data, size_t nbytes, fl_dtype dtype,
                         bool finite) {
    if (!d || !data || nbytes == 0) return -1;
    size_t es = fl_dtype_size(dtype);
    bool scan = finite && fl_dtype_is_float(dtype) && es > 0;
    /* 64 KiB blocks: scanned, then hashed while still in L2. */
    enum { BLOCK_BYTES = 1 << 16 };
    for (size_t at = 0; at < nbytes; at += BLOCK_BYTES) {
        size_t m = nbytes - at < BLOCK_BYTES ? nbytes - at : BLOCK_BYTES;
        const char *p = (const char *)data + at;
        if (scan) {
            int64_t bad = fl_first_nonfinite(p, (int64_t)(m / es), dtype);
            if (bad >= 0) return (int64_t)(at / es) + bad;
        }
        digest_bytes(d, p, m);
    }
    return -1;
}

uint64_t fl_digest_value(const fl_digest *d) {
    if (!d) return 0;
    if (d->in_block == 0) return XXH3_64bits_digest(&d->outer);
    XXH3_state_t last; /* the open block closes here, without changing d */
    XXH3_copyState(&last, &d->outer);
    unsigned char le[8];
    put_le64(le, XXH3_64bits_digest(&d->block));
    XXH3_64bits_update(&last, le, 8);
    return XXH3_64bits_digest(&last);
}

uint64_t fl_checksum(const void *data, size_t n) {
    size_t blocks = (n + FL_CHECKSUM_BLOCK - 1) / FL_CHECKSUM_BLOCK;
    unsigned char small[64 * 8];
    unsigned char *le = blocks <= 64 ? small : malloc(blocks * 8);
    if (!le) { /* no memory for the block values: the same value, streamed */
        fl_digest d;
        fl_digest_reset(&d);
        digest_bytes(&d, data, n);
        return fl_digest_value(&d);
    }
    const char *p = data;
#pragma omp parallel for schedule(dynamic, 1) if (blocks > 1)
    for (size_t b = 0; b < blocks; b++) {
        size_t len = b + 1 < blocks ? FL_CHECKSUM_BLOCK : n - b * FL_CHECKSUM_BLOCK;
        put_le64(le + 8 * b, HASH_ONESHOT(p + b * FL_CHECKSUM_BLOCK, len));
    }
    uint64_t v = XXH3_64bits(le, blocks * 8);
    if (le != small) free(le);
    return v;
}

void fl_checksum_text(uint64_t v, char *out) {
    snprintf(out, FL_CHECKSUM_TEXT, "xxh3-64:%016llx", (unsigned long long)v);
}
