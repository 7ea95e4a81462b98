/*
 * crc32c_bench.c: the speed of the project's CRC-32C (fl_crc32c, core/io/crc32c.c,
 * the checksum of TensorBoard event records) against ISA-L's crc32_iscsi (Debian's
 * libisal-dev) on the same buffers, and whether the two give the same value. It
 * settled which one the core keeps (issue 42); it prints numbers and asserts only
 * that both agree.
 *
 *   cc -O2 -std=c11 -Icore/include -Icore/base -Icore/ops benchmarks/crc32c_bench.c core/io/crc32c.c \
 *      -lisal -lpthread -o /tmp/crc32c_bench && /tmp/crc32c_bench [max_mib=64]
 *
 * Buffers of 1, 4, 16 and 64 MiB of fixed pseudo-random bytes; GB/s = 1e9 bytes/s,
 * best of 5 runs. Links core/io/crc32c.c as it stands, so after the core moved to
 * ISA-L both rows time the same code (compare with -DOURS_TABLE, which times the
 * byte-at-a-time table the core had before).
 */
#define _POSIX_C_SOURCE 200809L
#include <isa-l/crc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "fsdp.h"

#ifdef OURS_TABLE
/* The core's former CRC-32C, kept here only to be measured: a 256-entry table,
 * one byte per step. */
static uint32_t table[256];
static uint32_t table_crc32c(uint32_t crc, const void *data, size_t n) {
    if (table[1] == 0) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
    }
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}
#define OURS table_crc32c
#define OURS_NAME "table (byte at a time)"
#else
#define OURS fl_crc32c
#define OURS_NAME "fl_crc32c"
#endif

/* CRC-32C with the usual conventions (start ~0, final xor ~0), through ISA-L:
 * crc32_iscsi takes the register as it stands and returns it uninverted. */
static uint32_t isal_crc32c(const unsigned char *p, size_t n) {
    return ~crc32_iscsi((unsigned char *)p, (int)n, 0xFFFFFFFFu);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    size_t max_mib = argc > 1 ? (size_t)atoi(argv[1]) : 64;
    unsigned char *buf = malloc(max_mib << 20);
    if (!buf) return 1;
    uint64_t x = 0x9E3779B97F4A7C15u;
    for (size_t i = 0; i < (max_mib << 20); i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (unsigned char)x;
    }
    printf("%-8s %-24s %10s %10s\n", "MiB", "ours: " OURS_NAME, "ISA-L", "ratio");
    for (size_t mib = 1; mib <= max_mib; mib *= 4) {
        size_t n = mib << 20;
        double best_ours = 1e30, best_isal = 1e30;
        uint32_t a = 0, b = 0;
        for (int r = 0; r < 5; r++) {
            double t0 = now();
            a = OURS(0, buf, n);
            double t1 = now();
            b = isal_crc32c(buf, n);
            double t2 = now();
            if (t1 - t0 < best_ours) best_ours = t1 - t0;
            if (t2 - t1 < best_isal) best_isal = t2 - t1;
        }
        if (a != b) {
            printf("MISMATCH at %zu MiB: ours %08X, ISA-L %08X\n", mib, a, b);
            return 1;
        }
        printf("%-8zu %17.2f GB/s %5.2f GB/s %9.1fx\n", mib, n / best_ours / 1e9, n / best_isal / 1e9,
               best_ours / best_isal);
    }
    free(buf);
    return 0;
}
