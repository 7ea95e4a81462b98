/*
 * crc32c.c: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the
 * checksum of TensorBoard's event-file records (lua/fsdp/observe/tensorboard.lua),
 * through ISA-L's crc32_iscsi (Debian's libisal-dev), which picks the CPU's
 * CRC32/carry-less-multiply instructions at run time.
 *
 * ISA-L rather than the byte-at-a-time table this file held before (issue 42): on this
 * project's machine (AMD EPYC, Zen 5, 2 cores shared with other jobs, load average
 * ~14) on 2026-12-06, benchmarks/crc32c_bench.c -DOURS_TABLE measured the table at
 * 0.06-0.5 GB/s and ISA-L at 30-66 GB/s on 1-64 MiB buffers (60x to 580x), with equal
 * values. FSDP_CPU_ISA does not cap ISA-L's choice; the value is the same on every path.
 *
 * Conventions: fl_crc32c is the usual CRC-32C (register starts at ~0, result
 * inverted, so "123456789" gives 0xE3069283), and chains: passing the CRC of a
 * first part continues it over the next. crc32_iscsi takes and returns the raw
 * register, so the inversions are done here, and it takes an int length, so
 * buffers past 2^31 bytes go in pieces.
 */
#include "internal.h"

#include <isa-l/crc.h>

uint32_t fl_crc32c(uint32_t crc, const void *data, size_t n) {
    enum { PIECE = 1 << 30 };
    const unsigned char *p = data;
    uint32_t reg = ~crc;
    while (n > 0) {
        size_t len = n < PIECE ? n : PIECE;
        reg = crc32_iscsi((unsigned char *)p, (int)len, reg);
        p += len;
        n -= len;
    }
    return ~reg;
}
