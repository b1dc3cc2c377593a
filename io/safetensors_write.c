/* safetensors_write.c: writing safetensors files (fr_st_writer_*); see
 * safetensors.h. Reading is io/safetensors.c. A writer holds references to
 * its tensors and writes them, sorted by name as the reference implementation
 * does, through io/outfile.c, so a failed save leaves no partial file.
 *
 * The checksums go in the header, which comes first, and the output stream
 * cannot seek back: each tensor's bytes are therefore streamed twice, once
 * into its CRC and once into the file (crc32 runs at GB/s; a CUDA tensor is
 * staged twice). */
#include "safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda/fr_cuda.h"
#include "outfile.h"
#include "st_checksum.h"

/* Tensors are written from memory as they are (see safetensors.c). */
FR_STATIC_ASSERT(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors_write.c assumes a little-endian host");

/* Device tensors are staged through the host in chunks of this size. */
#define ST_CHUNK ((size_t)1 << 22)

/* The safetensors name of each fr_dtype, in fr_dtype's order. */
static const char *const st_names_of_fr[] = {"F32", "F16", "BF16", "I32", "U8"};
FR_STATIC_ASSERT(sizeof st_names_of_fr / sizeof *st_names_of_fr == FR_DTYPE_COUNT,
                 "st_names_of_fr must name every fr_dtype");

/* ---- writing ---- */

typedef struct {
    char *name;
    fr_tensor *t;
} st_wentry;

struct fr_st_writer {
    int n, cap;
    st_wentry *e;
    int n_meta, meta_cap;
    char **meta_keys, **meta_vals;
};

fr_st_writer *fr_st_writer_new(void) {
    fr_st_writer *w = calloc(1, sizeof *w);
    if (!w)
        fr_error(FR_ERR_OOM, "safetensors: out of memory creating a writer");
    return w;
}

void fr_st_writer_free(fr_st_writer *w) {
    if (!w)
        return;
    for (int i = 0; i < w->n; i++) {
        free(w->e[i].name);
        fr_release(w->e[i].t);
    }
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_vals[i]);
    }
    free(w->e);
    free(w->meta_keys);
    free(w->meta_vals);
    free(w);
}

fr_status fr_st_writer_add(fr_st_writer *w, const char *name, fr_tensor *t) {
    if (!w || !name)
        return fr_error(FR_ERR_ARG, "safetensors: writer_add: writer or name is NULL");
    FR_TRY(fr_check_defined("safetensors writer_add", name, t));
    if (!name[0] || !strcmp(name, "__metadata__"))
        return fr_error(FR_ERR_ARG, "safetensors: writer_add: '%s' cannot name a tensor", name);
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->e[i].name, name))
            return fr_error(FR_ERR_ARG, "safetensors: writer_add: tensor '%s' added twice", name);
    if (w->n == w->cap) {
        int cap = w->cap ? w->cap * 2 : 16;
        st_wentry *e = realloc(w->e, (size_t)cap * sizeof *e);
        if (!e)
            return fr_error(FR_ERR_OOM, "safetensors: writer_add: out of memory");
        w->e = e;
        w->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy)
        return fr_error(FR_ERR_OOM, "safetensors: writer_add: out of memory");
    w->e[w->n].name = copy;
    w->e[w->n].t = fr_retain(t);
    w->n++;
    return FR_OK;
}

fr_status fr_st_writer_add_metadata(fr_st_writer *w, const char *key, const char *value) {
    if (!w || !key || !value)
        return fr_error(FR_ERR_ARG, "safetensors: add_metadata: writer, key or value is NULL");
    if (!strcmp(key, FR_ST_CHECKSUM_KEY))
        return fr_error(FR_ERR_ARG, "safetensors: add_metadata: key '%s' is reserved: save writes the "
                        "file's checksums under it", key);
    for (int i = 0; i < w->n_meta; i++)
        if (!strcmp(w->meta_keys[i], key))
            return fr_error(FR_ERR_ARG, "safetensors: add_metadata: key '%s' added twice", key);
    if (w->n_meta == w->meta_cap) {
        int cap = w->meta_cap ? w->meta_cap * 2 : 8;
        char **k = realloc(w->meta_keys, (size_t)cap * sizeof *k);
        if (k)
            w->meta_keys = k;
        char **v = realloc(w->meta_vals, (size_t)cap * sizeof *v);
        if (v)
            w->meta_vals = v;
        if (!k || !v)
            return fr_error(FR_ERR_OOM, "safetensors: add_metadata: out of memory");
        w->meta_cap = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return fr_error(FR_ERR_OOM, "safetensors: add_metadata: out of memory");
    }
    w->meta_keys[w->n_meta] = k;
    w->meta_vals[w->n_meta] = v;
    w->n_meta++;
    return FR_OK;
}

/* A growable text buffer for the header. */
typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} st_buf;

static void buf_put(st_buf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > cap)
            cap *= 2;
        char *s2 = realloc(b->s, cap);
        if (!s2) {
            b->oom = true;
            return;
        }
        b->s = s2;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void buf_puts(st_buf *b, const char *s) { buf_put(b, s, strlen(s)); }

static void buf_json_str(st_buf *b, const char *s) {
    buf_puts(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            buf_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            buf_puts(b, esc);
        } else {
            buf_put(b, (const char *)&c, 1);
        }
    }
    buf_puts(b, "\"");
}

static int wentry_cmp(const void *a, const void *b) {
    return strcmp(((const st_wentry *)a)->name, ((const st_wentry *)b)->name);
}

/* The header text, the checksum field last in the metadata, padded with
 * spaces so the data starts 8-byte aligned. */
static fr_status st_build_header(fr_st_writer *w, const char *sums, st_buf *b) {
    char num[64];
    uint64_t offset = 0;
    buf_puts(b, "{\"__metadata__\":{");
    for (int i = 0; i < w->n_meta; i++) {
        buf_json_str(b, w->meta_keys[i]);
        buf_puts(b, ":");
        buf_json_str(b, w->meta_vals[i]);
        buf_puts(b, ",");
    }
    buf_json_str(b, FR_ST_CHECKSUM_KEY);
    buf_puts(b, ":");
    buf_json_str(b, sums);
    buf_puts(b, "}");
    for (int i = 0; i < w->n; i++) {
        const fr_tensor *t = w->e[i].t;
        buf_puts(b, ",");
        buf_json_str(b, w->e[i].name);
        buf_puts(b, ":{\"dtype\":\"");
        buf_puts(b, st_names_of_fr[t->dtype]);
        buf_puts(b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)t->shape[d]);
            buf_puts(b, num);
        }
        uint64_t nb = fr_nbytes(t);
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                 (unsigned long long)(offset + nb));
        buf_puts(b, num);
        offset += nb;
    }
    buf_puts(b, "}");
    while (b->n % 8)
        buf_puts(b, " ");
    return b->oom ? fr_error(FR_ERR_OOM, "safetensors: out of memory building the header") : FR_OK;
}

/* Where a tensor's bytes go: into the file, or into its CRC. */
typedef fr_status (*st_sink)(void *ctx, const void *p, size_t n);

static fr_status sink_file(void *fp, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, fp) != n)
        return fr_error(FR_ERR_IO, "write failed: %s", strerror(errno));
    return FR_OK;
}

static fr_status sink_crc(void *crc, const void *p, size_t n) {
    *(uint32_t *)crc = fr_st_crc_update(*(uint32_t *)crc, p, n);
    return FR_OK;
}

/* Hands t's bytes, packed, to `sink` from host memory: a CPU tensor at
 * once, a device tensor staged in bounded chunks. */
static fr_status st_stream_tensor(const fr_tensor *t, st_sink sink, void *ctx) {
    fr_tensor *c = fr_contiguous((fr_tensor *)t, FR_TAG_WORKSPACE);
    if (!c)
        return fr_last_status();
    size_t total = fr_nbytes(c);
    fr_status st = FR_OK;
    if (fr_device_of(c) == FR_CPU) {
        st = sink(ctx, fr_data(c), total);
    } else {
        size_t chunk = total < ST_CHUNK ? total : ST_CHUNK;
        char *stage = malloc(chunk ? chunk : 1);
        if (!stage)
            st = fr_error(FR_ERR_OOM, "out of memory staging a device tensor");
        for (size_t at = 0; stage && at < total && st == FR_OK; at += chunk) {
            size_t n = total - at < chunk ? total - at : chunk;
            st = fr_cuda_memcpy(stage, (const char *)fr_data(c) + at, n, FR_COPY_D2H);
            if (st == FR_OK)
                st = sink(ctx, stage, n);
        }
        free(stage);
    }
    fr_release(c);
    return st;
}

/* The checksum field's text (safetensors.h): the metadata's CRC, then each
 * tensor's in the writer's order, which is by name once save has sorted. */
static fr_status st_checksums(const fr_st_writer *w, const char *path, char **text) {
    uint32_t *sums = malloc(((size_t)w->n + 1) * sizeof *sums);
    if (!sums)
        return fr_error(FR_ERR_OOM, "safetensors: save %s: out of memory for the checksums", path);
    fr_status st = fr_st_crc_metadata(w->n_meta, w->meta_keys, w->meta_vals, NULL, &sums[0]);
    for (int i = 0; i < w->n && st == FR_OK; i++) {
        const fr_tensor *t = w->e[i].t;
        sums[i + 1] = fr_st_crc_begin(w->e[i].name, st_names_of_fr[t->dtype], t->ndim, t->shape);
        st = st_stream_tensor(t, sink_crc, &sums[i + 1]);
        if (st != FR_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", fr_last_error());
            fr_error(st, "safetensors: save %s failed (previous file left as it was): tensor '%s': %s", path,
                     w->e[i].name, why);
        }
    }
    if (st == FR_OK && !(*text = fr_st_sums_format(sums, w->n + 1)))
        st = fr_error(FR_ERR_OOM, "safetensors: save %s: out of memory for the checksums", path);
    free(sums);
    return st;
}

fr_status fr_st_writer_save(fr_st_writer *w, const char *path) {
    if (!w || !path)
        return fr_error(FR_ERR_ARG, "safetensors: save: writer or path is NULL");
    if (w->n)
        qsort(w->e, (size_t)w->n, sizeof *w->e, wentry_cmp);
    char *sums = NULL;
    FR_TRY(st_checksums(w, path, &sums));
    st_buf hdr = {0};
    fr_status built = st_build_header(w, sums, &hdr);
    free(sums);
    if (built != FR_OK) {
        free(hdr.s);
        return built;
    }
    char why[768] = "";
    fr_outfile *out = fr_outfile_open(path);
    if (!out) {
        free(hdr.s);
        snprintf(why, sizeof why, "%s", fr_last_error());
        return fr_error(fr_last_status(), "safetensors: save: %s", why);
    }
    FILE *fp = fr_outfile_stream(out);
    fr_status st = FR_OK;
    unsigned char lenbuf[8];
    for (int b = 0; b < 8; b++)
        lenbuf[b] = (unsigned char)((uint64_t)hdr.n >> (8 * b));
    if (fwrite(lenbuf, 1, 8, fp) != 8 || fwrite(hdr.s, 1, hdr.n, fp) != hdr.n)
        st = fr_error(FR_ERR_IO, "header write failed: %s", strerror(errno));
    for (int i = 0; i < w->n && st == FR_OK; i++) {
        st = st_stream_tensor(w->e[i].t, sink_file, fp);
        if (st != FR_OK) {
            snprintf(why, sizeof why, "tensor '%s': %s", w->e[i].name, fr_last_error());
            fr_error(st, "%s", why);
        }
    }
    free(hdr.s);
    if (st != FR_OK) {
        snprintf(why, sizeof why, "%s", fr_last_error());
        fr_outfile_abort(out);
        return fr_error(st, "safetensors: save %s failed (previous file left as it was): %s", path, why);
    }
    st = fr_outfile_commit(out);
    if (st != FR_OK) {
        snprintf(why, sizeof why, "%s", fr_last_error());
        fr_error(st, "safetensors: save: %s", why);
    }
    return st;
}
