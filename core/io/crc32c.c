/*
 * crc32c.c: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the
 * checksum of TensorBoard's event-file records (lua/fsdp/observe/tensorboard.lua).
 *
 * Debian packages no C library for CRC-32C (zlib's crc32 is the other
 * polynomial), and the records it guards are a few hundred bytes per
 * logged step, so a byte-at-a-time table is enough: the table is built
 * once, on first use, from the polynomial rather than pasted in.
 */
#include "error.h"

#include <pthread.h>

static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[i] = c;
    }
}

uint32_t fl_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&table_once, build_table);
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}
