/* st_checksum.h (internal to io/safetensors*.c): the CRC-32s stored under
 * FR_ST_CHECKSUM_KEY, computed here once for the writer and the reader so
 * that the two cannot drift apart. What each CRC covers is defined in
 * io/safetensors.h. */
#ifndef FR_ST_CHECKSUM_H
#define FR_ST_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#include "../tensor/tensor.h"

/* A tensor's CRC up to its data: name, 0, dtype (the header's spelling), 0,
 * shape as decimal integers joined by ',', 0. The data bytes follow through
 * fr_st_crc_update. */
uint32_t fr_st_crc_begin(const char *name, const char *dtype, int ndim, const int64_t *shape);
/* crc carried over n more bytes (any n: zlib takes at most UINT_MAX a call). */
uint32_t fr_st_crc_update(uint32_t crc, const void *p, size_t n);
/* The metadata's CRC over the n (key, value) pairs but `skip` (may be
 * NULL), keys sorted bytewise: key, 0, value, 0 for each. The keys are
 * unique (both sides refuse a duplicate before this). FR_ERR_OOM only. */
fr_status fr_st_crc_metadata(int n, char *const *keys, char *const *vals, const char *skip, uint32_t *out);

/* The field's text for n CRCs: 8 lowercase hex digits each, one space
 * between; malloc'd, NULL when out of memory. */
char *fr_st_sums_format(const uint32_t *sums, int n);
/* Whether `text` is exactly that form for n CRCs; fills sums. */
bool fr_st_sums_parse(const char *text, uint32_t *sums, int n);

#endif
