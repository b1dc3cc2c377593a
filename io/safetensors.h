/* safetensors.h: reading and writing safetensors files.
 *
 * Format: 8-byte little-endian header length, a JSON object mapping each
 * tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
 * relative to the end of the header) plus an optional "__metadata__" object of
 * string values (other JSON values are kept as keys without a value), then the raw little-endian data. Files written here load with
 * PyTorch's `safetensors` package and the other way round.
 *
 * Reading validates everything before use: a malformed header, an unknown
 * dtype, offsets past the end of the file or overlapping, a shape that does
 * not match its byte count. Every error names the file and the field.
 * Writing goes through io/outfile.h: a regular file only, atomic (a
 * temporary file beside the target, fsync, rename), so a crash or a failed
 * write mid-way leaves the previous file intact.
 *
 * Checksums: every file written here carries FR_ST_CHECKSUM_KEY in its
 * __metadata__, so that a byte changed after the save (a bad disk, a bad
 * copy, an edit by hand) is an error instead of different weights. Its value
 * is CRC-32s (zlib's crc32), each 8 lowercase hex digits, separated by one
 * space: first the metadata's, then one per tensor in the order of their
 * names sorted bytewise (strcmp):
 *  - the metadata's covers every other __metadata__ entry, keys sorted
 *    bytewise: key, a 0 byte, value (as decoded from JSON), a 0 byte;
 *  - a tensor's covers its name, a 0 byte, its dtype as the header spells it
 *    ("F32"), a 0 byte, its shape as decimal integers joined by ',' (empty
 *    for 0-d), a 0 byte, then its data bytes: everything the header says of
 *    it but where it lies, so a file laid out anew by another writer that
 *    keeps the metadata still checks.
 * Opening checks the field's form and the metadata's checksum (the header
 * is read anyway); a tensor's checksum is checked whenever its bytes are read
 * whole (fr_st_get, fr_st_read_into, fr_st_check_i64_fits_i32) and by
 * fr_st_verify. A file without the field (older frugal files, other tools'
 * files) is read as before, unchecked. Errors are FR_ERR_FORMAT naming the
 * file and, for data, the tensor. */
#ifndef FR_SAFETENSORS_H
#define FR_SAFETENSORS_H

#include "../tensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fr_st_file fr_st_file;

/* The __metadata__ key of the checksums (see above); reserved: a writer's
 * own metadata may not use it. */
#define FR_ST_CHECKSUM_KEY "frugal.crc32"

/* Reads and validates a whole file. NULL with FR_ERR_IO / FR_ERR_FORMAT. */
fr_st_file *fr_st_open(const char *path);
void fr_st_close(fr_st_file *f);

int fr_st_count(const fr_st_file *f);
const char *fr_st_name(const fr_st_file *f, int i);
/* -1 when absent. */
int fr_st_find(const fr_st_file *f, const char *name);
/* FR_DTYPE_COUNT for a valid safetensors dtype frugal cannot hold (I64,
 * F64, ...): such a file still opens, and fr_st_get on that entry fails with
 * FR_ERR_DTYPE naming it. */
fr_dtype fr_st_dtype(const fr_st_file *f, int i);
int fr_st_ndim(const fr_st_file *f, int i);
const int64_t *fr_st_shape(const fr_st_file *f, int i);
/* Whether entry i is I64, PyTorch's default integer dtype (BatchNorm's
 * num_batches_tracked): fr_st_read_into reads it into an i32 tensor of the
 * same shape when every value fits, else fails naming the value. */
bool fr_st_is_i64(const fr_st_file *f, int i);
/* FR_OK when every value of entry i (I64) fits in i32; FR_ERR_FORMAT naming
 * the file, the tensor, the element and its value otherwise. */
fr_status fr_st_check_i64_fits_i32(const fr_st_file *f, int i);
/* A metadata value, or NULL (absent, or not a JSON string). */
const char *fr_st_metadata(const fr_st_file *f, const char *key);
/* The metadata keys, string-valued or not, in file order. */
int fr_st_metadata_count(const fr_st_file *f);
const char *fr_st_metadata_key(const fr_st_file *f, int i);
/* What the value of `key` is: "a string", "null", "a boolean", "a number",
 * "an array" or "an object" (the format wants strings; other tools write
 * the rest); NULL when absent. */
const char *fr_st_metadata_kind(const fr_st_file *f, const char *key);

/* A new tensor holding the named entry, on `dev`. NULL with an error naming
 * the file and the tensor when absent. */
fr_tensor *fr_st_get(const fr_st_file *f, const char *name, fr_device dev, fr_mem_tag tag);
/* Copies the named entry into an existing tensor after checking dtype and
 * shape (the error names the file, the tensor, and both shapes). A checksum
 * mismatch is found once the bytes are in dst: a caller that must change
 * nothing on failure calls fr_st_verify first. */
fr_status fr_st_read_into(const fr_st_file *f, const char *name, fr_tensor *dst);
/* Reads the named entry's bytes (in bounded chunks, nothing allocated for
 * the tensor) and checks them against the file's checksum; FR_OK at once for
 * a file without checksums, and for an entry already checked in this open
 * file. FR_ERR_FORMAT naming the file and the tensor on a mismatch. */
fr_status fr_st_verify(const fr_st_file *f, const char *name);

typedef struct fr_st_writer fr_st_writer;
fr_st_writer *fr_st_writer_new(void);
void fr_st_writer_free(fr_st_writer *w);
/* Adds a tensor under `name` (its values are read at save time, so the
 * tensor is retained until then). Duplicate names are an error. */
fr_status fr_st_writer_add(fr_st_writer *w, const char *name, fr_tensor *t);
/* FR_ST_CHECKSUM_KEY is refused: fr_st_writer_save writes it. */
fr_status fr_st_writer_add_metadata(fr_st_writer *w, const char *key, const char *value);
/* Writes atomically (fr_outfile_open / fr_outfile_commit, io/outfile.h),
 * with the checksums above. */
fr_status fr_st_writer_save(fr_st_writer *w, const char *path);

#ifdef __cplusplus
}
#endif
#endif
