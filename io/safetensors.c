/* safetensors.c: reading safetensors files; see safetensors.h. Writing is
 * io/safetensors_write.c.
 *
 * The header is parsed by the strict JSON parser of json.c into a tree,
 * then checked against the safetensors schema. The data section is not loaded at open: each tensor is
 * read from the file when asked for, straight into its own storage on the
 * CPU, so opening a checkpoint costs only its header. The checksums
 * (safetensors.h) follow the same split: the metadata's is checked at open,
 * a tensor's as its bytes are read. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cuda/fr_cuda.h"
#include "json.h"
#include "outfile.h"
#include "st_checksum.h"

/* The format is little-endian and tensors are written from memory as they
 * are, so a big-endian host would need byte swaps this file does not have. */
FR_STATIC_ASSERT(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors.c assumes a little-endian host");

/* The reference implementation refuses headers above 100 MB; a larger length
 * field is a corrupt file, and must never become a huge allocation. */
#define ST_MAX_HEADER ((uint64_t)100000000)
/* Host staging for device tensors is done in chunks of this size. */
#define ST_CHUNK ((size_t)1 << 22)

/* ---- dtypes ---- */

typedef struct {
    const char *name;
    size_t size;
    fr_dtype dtype; /* FR_DTYPE_COUNT: a valid safetensors dtype frugal cannot hold */
} st_dtype_info;

static const st_dtype_info st_dtypes[] = {
    {"F32", 4, FR_F32},            {"F16", 2, FR_F16},           {"BF16", 2, FR_BF16},
    {"I32", 4, FR_I32},            {"U8", 1, FR_U8},             {"F64", 8, FR_DTYPE_COUNT},
    {"I64", 8, FR_DTYPE_COUNT},    {"U64", 8, FR_DTYPE_COUNT},   {"U32", 4, FR_DTYPE_COUNT},
    {"I16", 2, FR_DTYPE_COUNT},    {"U16", 2, FR_DTYPE_COUNT},   {"I8", 1, FR_DTYPE_COUNT},
    {"BOOL", 1, FR_DTYPE_COUNT},   {"F8_E4M3", 1, FR_DTYPE_COUNT}, {"F8_E5M2", 1, FR_DTYPE_COUNT},
};

static const st_dtype_info *st_dtype_lookup(const char *name) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof *st_dtypes; i++)
        if (!strcmp(st_dtypes[i].name, name))
            return &st_dtypes[i];
    return NULL;
}

/* ---- the file ---- */

typedef struct {
    char *name;
    const st_dtype_info *dt;
    int ndim;
    int64_t shape[FR_MAX_DIMS];
    uint64_t begin, end;  /* relative to the data section */
} st_entry;

struct fr_st_file {
    char *path;
    FILE *fp;
    uint64_t data_start;  /* 8 + header length */
    int n;
    st_entry *e;          /* sorted by name */
    int n_meta;
    char **meta_keys, **meta_vals; /* a value NULL: not a JSON string */
    const char **meta_kinds;       /* what each value is ("a string", "null", ...) */
    /* FR_ST_CHECKSUM_KEY's CRCs: sums[0] the metadata's, sums[1 + i] entry
     * e[i]'s; NULL for a file without the field. */
    uint32_t *sums;
    /* Which entries' bytes have matched their CRC in this open file, so a
     * load that verifies first and copies after computes each CRC once.
     * Written through `const fr_st_file *`: it records what was read, the
     * file as the API shows it does not change. */
    bool *checked;
};

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int entry_cmp_begin(const void *a, const void *b) {
    const st_entry *x = *(st_entry *const *)a, *y = *(st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

void fr_st_close(fr_st_file *f) {
    if (!f)
        return;
    if (f->fp)
        fclose(f->fp);
    for (int i = 0; i < f->n; i++)
        free(f->e[i].name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->e);
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->meta_kinds);
    free(f->sums);
    free(f->checked);
    free(f->path);
    free(f);
}

static fr_status st_bad(const fr_st_file *f, const char *name, const char *fmt, const char *detail) {
    char what[512];
    snprintf(what, sizeof what, fmt, detail);
    return fr_error(FR_ERR_FORMAT, "safetensors: %s: tensor '%s': %s", f->path, name, what);
}

/* Fills one entry from its JSON object {"dtype", "shape", "data_offsets"}. */
static fr_status st_parse_entry(fr_st_file *f, st_entry *e, const fr_json *v) {
    if (v->kind != FR_JSON_OBJ)
        return st_bad(f, e->name, "%sentry is not an object", "");
    const fr_json *dtype = NULL, *shape = NULL, *offs = NULL;
    for (int k = 0; k < v->n; k++) {
        const fr_json **slot = !strcmp(v->keys[k], "dtype")          ? &dtype
                             : !strcmp(v->keys[k], "shape")        ? &shape
                             : !strcmp(v->keys[k], "data_offsets") ? &offs
                                                                   : NULL;
        if (!slot)
            return st_bad(f, e->name, "unknown field \"%s\"", v->keys[k]);
        if (*slot)
            return st_bad(f, e->name, "field \"%s\" appears twice", v->keys[k]);
        *slot = &v->kids[k];
    }
    if (!dtype || !shape || !offs)
        return st_bad(f, e->name, "missing field \"%s\"", !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
    if (dtype->kind != FR_JSON_STR)
        return st_bad(f, e->name, "%s\"dtype\" is not a string", "");
    e->dt = st_dtype_lookup(dtype->str);
    if (!e->dt)
        return st_bad(f, e->name, "unknown dtype \"%s\"", dtype->str);
    if (shape->kind != FR_JSON_ARR)
        return st_bad(f, e->name, "%s\"shape\" is not an array", "");
    if (shape->n > FR_MAX_DIMS) {
        char n[16];
        snprintf(n, sizeof n, "%d", shape->n);
        return st_bad(f, e->name, "\"shape\" has %s dimensions, frugal supports at most 5", n);
    }
    e->ndim = shape->n;
    uint64_t numel = 1;
    for (int d = 0; d < shape->n; d++) {
        const fr_json *s = &shape->kids[d];
        if (s->kind != FR_JSON_INT || s->num < 0)
            return st_bad(f, e->name, "%s\"shape\" entries must be integers >= 0", "");
        e->shape[d] = s->num;
        if (s->num && numel > (uint64_t)INT64_MAX / 8 / (uint64_t)s->num)
            return st_bad(f, e->name, "%s\"shape\" is too large", "");
        numel *= (uint64_t)s->num;
    }
    if (offs->kind != FR_JSON_ARR || offs->n != 2 || offs->kids[0].kind != FR_JSON_INT ||
        offs->kids[1].kind != FR_JSON_INT || offs->kids[0].num < 0 || offs->kids[1].num < 0)
        return st_bad(f, e->name, "%s\"data_offsets\" must be [begin, end] with integers >= 0", "");
    e->begin = (uint64_t)offs->kids[0].num;
    e->end = (uint64_t)offs->kids[1].num;
    if (e->end < e->begin)
        return st_bad(f, e->name, "%s\"data_offsets\" end is before begin", "");
    if (e->end - e->begin != numel * e->dt->size) {
        char detail[160];
        snprintf(detail, sizeof detail, "\"data_offsets\" span %llu bytes but shape and dtype %s need %llu",
                 (unsigned long long)(e->end - e->begin), e->dt->name,
                 (unsigned long long)(numel * e->dt->size));
        return st_bad(f, e->name, "%s", detail);
    }
    return FR_OK;
}

FR_STATIC_ASSERT(FR_JSON_NULL == 6, "metadata value kinds, in fr_json_kind's order");

static fr_status st_parse_metadata(fr_st_file *f, const fr_json *v) {
    if (v->kind != FR_JSON_OBJ)
        return fr_error(FR_ERR_FORMAT, "safetensors: %s: \"__metadata__\" is not an object", f->path);
    f->meta_keys = calloc((size_t)v->n + 1, sizeof *f->meta_keys);
    f->meta_vals = calloc((size_t)v->n + 1, sizeof *f->meta_vals);
    f->meta_kinds = calloc((size_t)v->n + 1, sizeof *f->meta_kinds);
    if (!f->meta_keys || !f->meta_vals || !f->meta_kinds)
        return fr_error(FR_ERR_OOM, "safetensors: %s: out of memory reading metadata", f->path);
    for (int k = 0; k < v->n; k++) {
        for (int j = 0; j < k; j++)
            if (!strcmp(v->keys[j], v->keys[k]))
                return fr_error(FR_ERR_FORMAT, "safetensors: %s: metadata key \"%s\" appears twice",
                                f->path, v->keys[k]);
        /* The format says string values; other tools write other JSON
         * there. Kept as a key without a value: the reader of a key it
         * needs names it (train/state.c), any other is ignored. */
        bool str = v->kids[k].kind == FR_JSON_STR;
        f->meta_keys[k] = strdup(v->keys[k]);
        f->meta_vals[k] = str ? strdup(v->kids[k].str) : NULL;
        f->n_meta = k + 1;
        if (!f->meta_keys[k] || (str && !f->meta_vals[k]))
            return fr_error(FR_ERR_OOM, "safetensors: %s: out of memory reading metadata", f->path);
        static const char *const kinds[] = {"an object", "an array", "a string", "a number", "a number",
                                            "a boolean", "null"};
        f->meta_kinds[k] = kinds[v->kids[k].kind];
    }
    return FR_OK;
}

/* Every byte of the data section belongs to exactly one tensor: sorted by
 * offset, each tensor starts where the previous ended and the last ends at
 * the end of the file (what the reference implementation demands too). */
static fr_status st_check_layout(fr_st_file *f, uint64_t data_size) {
    st_entry **by = malloc(((size_t)f->n + 1) * sizeof *by);
    if (!by)
        return fr_error(FR_ERR_OOM, "safetensors: %s: out of memory checking offsets", f->path);
    for (int i = 0; i < f->n; i++)
        by[i] = &f->e[i];
    qsort(by, (size_t)f->n, sizeof *by, entry_cmp_begin);
    uint64_t at = 0;
    fr_status st = FR_OK;
    for (int i = 0; i < f->n && st == FR_OK; i++) {
        if (by[i]->end > data_size)
            st = fr_error(FR_ERR_FORMAT,
                          "safetensors: %s: tensor '%s': data_offsets [%llu, %llu] pass the end of the "
                          "data (%llu bytes)", f->path, by[i]->name, (unsigned long long)by[i]->begin,
                          (unsigned long long)by[i]->end, (unsigned long long)data_size);
        else if (by[i]->begin < at)
            st = fr_error(FR_ERR_FORMAT, "safetensors: %s: tensor '%s': data_offsets [%llu, %llu] "
                          "overlap tensor '%s'", f->path, by[i]->name, (unsigned long long)by[i]->begin,
                          (unsigned long long)by[i]->end, by[i - 1]->name);
        else if (by[i]->begin > at)
            st = fr_error(FR_ERR_FORMAT, "safetensors: %s: tensor '%s': data_offsets begin at %llu, "
                          "leaving a gap after byte %llu", f->path, by[i]->name,
                          (unsigned long long)by[i]->begin, (unsigned long long)at);
        else
            at = by[i]->end;
    }
    free(by);
    if (st == FR_OK && at != data_size)
        st = fr_error(FR_ERR_FORMAT, "safetensors: %s: the tensors cover %llu data bytes but the file "
                      "holds %llu (trailing bytes)", f->path, (unsigned long long)at,
                      (unsigned long long)data_size);
    return st;
}

/* FR_ST_CHECKSUM_KEY, when the file has it: its form (one CRC for the
 * metadata and one per tensor), then the metadata's CRC, which needs nothing
 * past the header. The tensors' are checked as their bytes are read. */
static fr_status st_parse_sums(fr_st_file *f) {
    const char *kind = fr_st_metadata_kind(f, FR_ST_CHECKSUM_KEY);
    if (!kind)
        return FR_OK; /* an older frugal's file, or another tool's: unchecked */
    const char *text = fr_st_metadata(f, FR_ST_CHECKSUM_KEY);
    f->sums = malloc(((size_t)f->n + 1) * sizeof *f->sums);
    f->checked = calloc((size_t)f->n + 1, sizeof *f->checked);
    if (!f->sums || !f->checked)
        return fr_error(FR_ERR_OOM, "safetensors: %s: out of memory reading the checksums", f->path);
    if (!text || !fr_st_sums_parse(text, f->sums, f->n + 1))
        return fr_error(FR_ERR_FORMAT, "safetensors: %s: metadata field \"" FR_ST_CHECKSUM_KEY "\" is not "
                        "%d CRC-32s of 8 lowercase hex digits separated by spaces (the metadata's, then one "
                        "per tensor in name order)%s%s", f->path, f->n + 1, text ? "" : ": it is ",
                        text ? "" : kind);
    /* frugal writes strings only: another kind of value was put there later */
    for (int i = 0; i < f->n_meta; i++)
        if (!f->meta_vals[i])
            return fr_error(FR_ERR_FORMAT, "safetensors: %s: metadata field \"%s\" is %s, but a file with "
                            "\"" FR_ST_CHECKSUM_KEY "\" holds only strings: the header was changed after "
                            "it was written", f->path, f->meta_keys[i], f->meta_kinds[i]);
    uint32_t crc;
    FR_TRY(fr_st_crc_metadata(f->n_meta, f->meta_keys, f->meta_vals, FR_ST_CHECKSUM_KEY, &crc));
    if (crc != f->sums[0])
        return fr_error(FR_ERR_FORMAT, "safetensors: %s: the __metadata__ does not match its checksum in "
                        "\"" FR_ST_CHECKSUM_KEY "\" (%08x stored, %08x read): a field was changed after the "
                        "file was written", f->path, (unsigned)f->sums[0], (unsigned)crc);
    return FR_OK;
}

static fr_status st_parse_header(fr_st_file *f, const char *text, size_t len, uint64_t data_size) {
    char context[600];
    snprintf(context, sizeof context, "safetensors: %s: header", f->path);
    fr_json root;
    fr_status st = fr_json_parse(&root, text, len, context);
    if (st == FR_OK && root.kind != FR_JSON_OBJ)
        st = fr_error(FR_ERR_FORMAT, "safetensors: %s: the header is not a JSON object", f->path);
    if (st == FR_OK) {
        f->e = calloc((size_t)root.n + 1, sizeof *f->e);
        if (!f->e)
            st = fr_error(FR_ERR_OOM, "safetensors: %s: out of memory reading the header", f->path);
    }
    bool seen_meta = false;
    for (int k = 0; st == FR_OK && k < root.n; k++) {
        if (!strcmp(root.keys[k], "__metadata__")) {
            st = seen_meta ? fr_error(FR_ERR_FORMAT, "safetensors: %s: \"__metadata__\" appears twice",
                                      f->path)
                           : st_parse_metadata(f, &root.kids[k]);
            seen_meta = true;
            continue;
        }
        st_entry *e = &f->e[f->n];
        /* take the key: the tree is freed below */
        e->name = root.keys[k];
        root.keys[k] = NULL;
        f->n++;
        if (!e->name[0])
            st = fr_error(FR_ERR_FORMAT, "safetensors: %s: a tensor has an empty name", f->path);
        else
            st = st_parse_entry(f, e, &root.kids[k]);
    }
    fr_json_free(&root);
    if (st != FR_OK)
        return st;
    qsort(f->e, (size_t)f->n, sizeof *f->e, entry_cmp);
    for (int i = 1; i < f->n; i++)
        if (!strcmp(f->e[i - 1].name, f->e[i].name))
            return fr_error(FR_ERR_FORMAT, "safetensors: %s: tensor name '%s' appears twice", f->path,
                            f->e[i].name);
    FR_TRY(st_check_layout(f, data_size));
    return st_parse_sums(f);
}

fr_st_file *fr_st_open(const char *path) {
    if (!path) {
        fr_error(FR_ERR_ARG, "safetensors: open: path is NULL");
        return NULL;
    }
    fr_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        fr_error(FR_ERR_OOM, "safetensors: %s: out of memory", path);
        return NULL;
    }
    struct stat sb;
    char *header = NULL;
    unsigned char lenbuf[8];
    uint64_t hlen = 0;
    /* O_NONBLOCK, so that a FIFO is refused by fstat instead of blocking
     * the open until some writer appears; regular files ignore the flag. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fr_error(FR_ERR_IO, "safetensors: cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || !(f->fp = fdopen(fd, "rb"))) {
        close(fd);
        fr_error(FR_ERR_IO, "safetensors: %s is not a readable regular file (a FIFO, device or folder "
                 "is refused)", path);
        goto fail;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        fr_error(FR_ERR_FORMAT, "safetensors: %s: file is %llu bytes, too short for the 8-byte header "
                 "length", path, (unsigned long long)size);
        goto fail;
    }
    if (fread(lenbuf, 1, 8, f->fp) != 8) {
        fr_error(FR_ERR_IO, "safetensors: %s: cannot read the header length", path);
        goto fail;
    }
    for (int b = 7; b >= 0; b--)
        hlen = hlen << 8 | lenbuf[b];
    if (hlen > size - 8 || hlen > ST_MAX_HEADER || hlen < 2) {
        fr_error(FR_ERR_FORMAT, "safetensors: %s: header length field is %llu but the file holds %llu "
                 "bytes after it (limit %llu)", path, (unsigned long long)hlen,
                 (unsigned long long)(size - 8), (unsigned long long)ST_MAX_HEADER);
        goto fail;
    }
    header = malloc((size_t)hlen);
    if (!header) {
        fr_error(FR_ERR_OOM, "safetensors: %s: out of memory for a %llu-byte header", path,
                 (unsigned long long)hlen);
        goto fail;
    }
    if (fread(header, 1, (size_t)hlen, f->fp) != hlen) {
        fr_error(FR_ERR_IO, "safetensors: %s: cannot read the %llu-byte header", path,
                 (unsigned long long)hlen);
        goto fail;
    }
    f->data_start = 8 + hlen;
    if (st_parse_header(f, header, (size_t)hlen, size - f->data_start) != FR_OK)
        goto fail;
    free(header);
    return f;
fail:
    free(header);
    fr_st_close(f);
    return NULL;
}

int fr_st_count(const fr_st_file *f) { return f ? f->n : 0; }

const char *fr_st_name(const fr_st_file *f, int i) {
    FR_ASSERT(f && i >= 0 && i < f->n);
    return f->e[i].name;
}

int fr_st_find(const fr_st_file *f, const char *name) {
    if (!f || !name)
        return -1;
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f->e[mid].name, name);
        if (!c)
            return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

fr_dtype fr_st_dtype(const fr_st_file *f, int i) {
    FR_ASSERT(f && i >= 0 && i < f->n);
    return f->e[i].dt->dtype;
}

int fr_st_ndim(const fr_st_file *f, int i) {
    FR_ASSERT(f && i >= 0 && i < f->n);
    return f->e[i].ndim;
}

const int64_t *fr_st_shape(const fr_st_file *f, int i) {
    FR_ASSERT(f && i >= 0 && i < f->n);
    return f->e[i].shape;
}

const char *fr_st_metadata(const fr_st_file *f, const char *key) {
    if (!f || !key)
        return NULL;
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key))
            return f->meta_vals[i];
    return NULL;
}

int fr_st_metadata_count(const fr_st_file *f) {
    return f ? f->n_meta : 0;
}

const char *fr_st_metadata_key(const fr_st_file *f, int i) {
    FR_ASSERT(f && i >= 0 && i < f->n_meta);
    return f->meta_keys[i];
}

const char *fr_st_metadata_kind(const fr_st_file *f, const char *key) {
    for (int i = 0; f && key && i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key))
            return f->meta_kinds[i];
    return NULL;
}

bool fr_st_is_i64(const fr_st_file *f, int i) {
    FR_ASSERT(f && i >= 0 && i < f->n);
    return !strcmp(f->e[i].dt->name, "I64");
}

static fr_status st_pread(const fr_st_file *f, const st_entry *e, void *dst, uint64_t off, size_t n);

/* Whether e's bytes are still to be checked against a CRC as they are read. */
static bool st_unchecked(const fr_st_file *f, const st_entry *e) {
    return f->sums && !f->checked[e - f->e];
}

static uint32_t st_crc_begin(const st_entry *e) {
    return fr_st_crc_begin(e->name, e->dt->name, e->ndim, e->shape);
}

/* `crc`: st_crc_begin(e) carried over all of e's bytes, just read. */
static fr_status st_check_crc(const fr_st_file *f, const st_entry *e, uint32_t crc) {
    uint32_t want = f->sums[1 + (e - f->e)];
    if (crc != want)
        return fr_error(FR_ERR_FORMAT, "safetensors: %s: tensor '%s': its bytes do not match their checksum in "
                        "\"" FR_ST_CHECKSUM_KEY "\" (%08x stored, %08x read): the file was damaged or changed "
                        "after it was written", f->path, e->name, (unsigned)want, (unsigned)crc);
    f->checked[e - f->e] = true;
    return FR_OK;
}

/* Reads I64 entry e as i32 into out (NULL: only check), every value range
 * checked: a counter PyTorch keeps in 64 bits fits frugal's 32 unless it is
 * past 2^31 - 1, which is then an error, never a wrapped value. */
static fr_status st_read_i64_as_i32(const fr_st_file *f, const st_entry *e, int32_t *out) {
    size_t n = (size_t)(e->end - e->begin) / 8;
    int64_t *v = malloc(n ? n * 8 : 1);
    if (!v)
        return fr_error(FR_ERR_OOM, "safetensors: %s: out of memory reading tensor '%s'", f->path,
                        e->name);
    fr_status st = st_pread(f, e, v, 0, n * 8);
    if (st == FR_OK && st_unchecked(f, e))
        st = st_check_crc(f, e, fr_st_crc_update(st_crc_begin(e), v, n * 8));
    for (size_t k = 0; k < n && st == FR_OK; k++) {
        if (v[k] < INT32_MIN || v[k] > INT32_MAX)
            st = fr_error(FR_ERR_FORMAT, "safetensors: %s: tensor '%s' (I64) holds %lld at element %zu, "
                          "outside the i32 range frugal keeps it in", f->path, e->name,
                          (long long)v[k], k);
        else if (out)
            out[k] = (int32_t)v[k];
    }
    free(v);
    return st;
}

fr_status fr_st_check_i64_fits_i32(const fr_st_file *f, int i) {
    FR_ASSERT(fr_st_is_i64(f, i));
    return st_read_i64_as_i32(f, &f->e[i], NULL);
}

/* The entry for `name` if frugal can hold its dtype; else NULL with an error. */
static const st_entry *st_lookup(const fr_st_file *f, const char *name, const char *op) {
    if (!f || !name) {
        fr_error(FR_ERR_ARG, "safetensors: %s: file or name is NULL", op);
        return NULL;
    }
    int i = fr_st_find(f, name);
    if (i < 0) {
        fr_error(FR_ERR_ARG, "safetensors: %s: %s: no tensor named '%s'", op, f->path, name);
        return NULL;
    }
    if (f->e[i].dt->dtype == FR_DTYPE_COUNT) {
        fr_error(FR_ERR_DTYPE, "safetensors: %s: %s: tensor '%s' has unsupported dtype %s (frugal holds "
                 "F32, F16, BF16, I32, U8)", op, f->path, name, f->e[i].dt->name);
        return NULL;
    }
    return &f->e[i];
}

static fr_status st_pread(const fr_st_file *f, const st_entry *e, void *dst, uint64_t off, size_t n) {
    int fd = fileno(f->fp);
    char *p = dst;
    off_t at = (off_t)(f->data_start + e->begin + off);
    while (n > 0) {
        ssize_t got = pread(fd, p, n, at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return fr_error(FR_ERR_IO, "safetensors: %s: cannot read the data of tensor '%s': %s",
                            f->path, e->name, got < 0 ? strerror(errno) : "file shrank after opening");
        p += got;
        n -= (size_t)got;
        at += got;
    }
    return FR_OK;
}

/* Reads an entry's bytes into `dst`, a contiguous tensor of its size on any
 * device, checking its CRC; device tensors are filled through a bounded host
 * staging buffer. dst == NULL: only the check (fr_st_verify). */
static fr_status st_fill(const fr_st_file *f, const st_entry *e, fr_tensor *dst) {
    size_t total = (size_t)(e->end - e->begin);
    bool sum = st_unchecked(f, e);
    uint32_t crc = sum ? st_crc_begin(e) : 0;
    if (dst && fr_device_of(dst) == FR_CPU) {
        FR_TRY(st_pread(f, e, fr_data(dst), 0, total));
        return sum ? st_check_crc(f, e, fr_st_crc_update(crc, fr_data(dst), total)) : FR_OK;
    }
    size_t chunk = total < ST_CHUNK ? total : ST_CHUNK;
    char *stage = malloc(chunk ? chunk : 1);
    if (!stage)
        return fr_error(FR_ERR_OOM, "safetensors: %s: out of memory staging tensor '%s'", f->path,
                        e->name);
    fr_status st = FR_OK;
    for (size_t at = 0; at < total && st == FR_OK; at += chunk) {
        size_t n = total - at < chunk ? total - at : chunk;
        st = st_pread(f, e, stage, at, n);
        if (st == FR_OK && sum)
            crc = fr_st_crc_update(crc, stage, n);
        if (st == FR_OK && dst)
            st = fr_cuda_memcpy((char *)fr_data(dst) + at, stage, n, FR_COPY_H2D);
    }
    free(stage);
    return st == FR_OK && sum ? st_check_crc(f, e, crc) : st;
}

fr_status fr_st_verify(const fr_st_file *f, const char *name) {
    if (!f || !name)
        return fr_error(FR_ERR_ARG, "safetensors: verify: file or name is NULL");
    int i = fr_st_find(f, name);
    if (i < 0)
        return fr_error(FR_ERR_ARG, "safetensors: verify: %s: no tensor named '%s'", f->path, name);
    return st_unchecked(f, &f->e[i]) ? st_fill(f, &f->e[i], NULL) : FR_OK;
}

fr_tensor *fr_st_get(const fr_st_file *f, const char *name, fr_device dev, fr_mem_tag tag) {
    const st_entry *e = st_lookup(f, name, "get");
    if (!e)
        return NULL;
    fr_tensor *t = fr_empty(dev, e->dt->dtype, e->ndim, e->shape, tag);
    if (t && st_fill(f, e, t) != FR_OK)
        fr_clear(&t);
    return t;
}

static char *st_shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < len)
        snprintf(buf + used, len - used, ndim == 1 ? ",)" : ")");
    return buf;
}

fr_status fr_st_read_into(const fr_st_file *f, const char *name, fr_tensor *dst) {
    char a[96], b[96];
    FR_TRY(fr_check_defined("safetensors read_into", "dst", dst));
    int i64 = f ? fr_st_find(f, name) : -1;
    if (i64 >= 0 && fr_st_is_i64(f, i64) && dst->dtype == FR_I32) {
        const st_entry *e = &f->e[i64];
        if (e->ndim != dst->ndim || memcmp(e->shape, dst->shape, sizeof(int64_t) * (size_t)e->ndim) ||
            fr_device_of(dst) != FR_CPU || !fr_is_contiguous(dst))
            return fr_error(FR_ERR_SHAPE, "safetensors: read_into: %s: I64 tensor '%s' has shape %s; it "
                            "reads only into a contiguous CPU i32 tensor of that shape, not %s", f->path,
                            name, st_shape_str(e->ndim, e->shape, a, sizeof a), fr_shape_str(dst, b, sizeof b));
        FR_TRY(st_read_i64_as_i32(f, e, fr_data(dst)));
        fr_bump_version(dst, "st_read_into");
        return FR_OK;
    }
    const st_entry *e = st_lookup(f, name, "read_into");
    if (!e)
        return fr_last_status();
    if (e->dt->dtype != dst->dtype)
        return fr_error(FR_ERR_DTYPE, "safetensors: read_into: %s: tensor '%s' is %s, destination is %s",
                        f->path, name, e->dt->name, fr_dtype_name(dst->dtype));
    if (e->ndim != dst->ndim || memcmp(e->shape, dst->shape, sizeof(int64_t) * (size_t)e->ndim))
        return fr_error(FR_ERR_SHAPE, "safetensors: read_into: %s: tensor '%s' has shape %s in the "
                        "file, destination has shape %s", f->path, name,
                        st_shape_str(e->ndim, e->shape, a, sizeof a), fr_shape_str(dst, b, sizeof b));
    if (fr_is_contiguous(dst)) {
        FR_TRY(st_fill(f, e, dst));
        fr_bump_version(dst, "st_read_into");
        return FR_OK;
    }
    fr_tensor *tmp = fr_st_get(f, name, fr_device_of(dst), FR_TAG_WORKSPACE);
    fr_status st = tmp ? fr_copy_(dst, tmp) : fr_last_status();
    fr_release(tmp);
    return st;
}
