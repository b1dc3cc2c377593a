/* test_safetensors.c: safetensors round trips, PyTorch interop, malformed
 * files, and atomic saving. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "testlib.h"

/* ---- temp files ---- */

static const char *tmpdir;

static void make_tmpdir(void) { tmpdir = fr_t_make_tmpdir("st"); }
static void remove_tmpdir(void) { fr_t_remove_tmpdir(tmpdir); }

static char *tmp_path(char *buf, size_t len, const char *name) {
    snprintf(buf, len, "%s/%s", tmpdir, name);
    return buf;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (!fp)
        return;
    CHECK(fwrite(data, 1, n, fp) == n);
    fclose(fp);
}

/* A file with an explicit 8-byte length field, header text and data. */
static void write_st(const char *path, uint64_t hlen, const char *header, const void *data,
                     size_t ndata) {
    size_t htext = strlen(header);
    unsigned char *buf = malloc(8 + htext + ndata + 1);
    for (int b = 0; b < 8; b++)
        buf[b] = (unsigned char)(hlen >> (8 * b));
    memcpy(buf + 8, header, htext);
    if (ndata)
        memcpy(buf + 8 + htext, data, ndata);
    write_bytes(path, buf, 8 + htext + ndata);
    free(buf);
}

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)len + 1);
    *n = fread(buf, 1, (size_t)len, fp);
    fclose(fp);
    return buf;
}

static int count_temp_files(void) {
    DIR *d = opendir(tmpdir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strstr(e->d_name, ".tmp.") != NULL;
    if (d)
        closedir(d);
    return n;
}

/* ---- round trip ---- */

static bool same_bytes(const fr_tensor *a, const fr_tensor *b) {
    if (!a || !b || a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    fr_tensor *ca = fr_contiguous((fr_tensor *)a, FR_TAG_WORKSPACE);
    fr_tensor *cb = fr_contiguous((fr_tensor *)b, FR_TAG_WORKSPACE);
    bool same = !memcmp(fr_data(ca), fr_data(cb), fr_nbytes(ca));
    fr_release(ca);
    fr_release(cb);
    return same;
}

static void test_round_trip(void) {
    char path[512];
    make_tmpdir();
    tmp_path(path, sizeof path, "rt.safetensors");
    fr_tensor *f32 = fr_t_rand(FR_CPU, 2, FR_SHAPE(2, 3), 1);
    fr_tensor *f16 = fr_to_dtype(f32, FR_F16, FR_TAG_DATA);
    fr_tensor *bf16 = fr_to_dtype(f32, FR_BF16, FR_TAG_DATA);
    int32_t iv[5] = {-7, 0, 1, 2147483647, -2147483647 - 1};
    fr_tensor *i32 = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(5), FR_TAG_DATA, iv);
    uint8_t uv[8] = {0, 1, 2, 127, 128, 200, 254, 255};
    fr_tensor *u8 = fr_from_host(FR_CPU, FR_U8, 3, FR_SHAPE(2, 2, 2), FR_TAG_DATA, uv);
    float sv = -3.5f;
    fr_tensor *scalar = fr_from_host(FR_CPU, FR_F32, 0, NULL, FR_TAG_DATA, &sv);
    fr_tensor *empty = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(0, 3), FR_TAG_DATA);
    fr_tensor *nd5 = fr_t_rand(FR_CPU, 5, FR_SHAPE(1, 2, 1, 3, 2), 2);
    fr_tensor *wide = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 4), 3);
    fr_tensor *strided = fr_narrow(wide, 1, 1, 2);  // (3, 2), not contiguous
    CHECK(!fr_is_contiguous(strided));

    fr_st_writer *w = fr_st_writer_new();
    const char *names[] = {"z.f32", "f16", "bf16", "layer1.0.conv1.weight", "u8", "scalar",
                           "empty", "nd5", "strided", "we\"ird\\name\n"};
    fr_tensor *ts[] = {f32, f16, bf16, i32, u8, scalar, empty, nd5, strided, f32};
    int n = (int)(sizeof ts / sizeof *ts);
    for (int i = 0; i < n; i++)
        CHECK_OK(fr_st_writer_add(w, names[i], ts[i]));
    CHECK_OK(fr_st_writer_add_metadata(w, "format", "pt"));
    CHECK_OK(fr_st_writer_add_metadata(w, "note", "quote \" backslash \\ tab \t done"));
    /* The writer keeps references, so the caller may drop its own. */
    fr_clear(&strided);
    CHECK_OK(fr_st_writer_save(w, path));
    fr_st_writer_free(w);

    size_t len;
    unsigned char *raw = read_all(path, &len);
    CHECK(raw && len >= 8);
    uint64_t hlen = 0;
    for (int b = 7; raw && b >= 0; b--)
        hlen = hlen << 8 | raw[b];
    CHECK(hlen % 8 == 0 && raw[8] == '{' && raw[8 + hlen - 1] == ' ');
    free(raw);

    fr_st_file *f = fr_st_open(path);
    CHECK_NOTNULL(f);
    if (f) {
        CHECK(fr_st_count(f) == n);
        for (int i = 1; i < fr_st_count(f); i++)
            CHECK(strcmp(fr_st_name(f, i - 1), fr_st_name(f, i)) < 0);
        CHECK(fr_st_find(f, "absent") == -1);
        CHECK(!strcmp(fr_st_metadata(f, "format"), "pt"));
        CHECK(!strcmp(fr_st_metadata(f, "note"), "quote \" backslash \\ tab \t done"));
        CHECK(fr_st_metadata(f, "absent") == NULL);
        int k = fr_st_find(f, "u8");
        CHECK(k >= 0 && fr_st_dtype(f, k) == FR_U8 && fr_st_ndim(f, k) == 3 &&
              fr_st_shape(f, k)[2] == 2);
        k = fr_st_find(f, "scalar");
        CHECK(k >= 0 && fr_st_ndim(f, k) == 0);
        k = fr_st_find(f, "empty");
        CHECK(k >= 0 && fr_st_ndim(f, k) == 2 && fr_st_shape(f, k)[0] == 0);
        fr_clear(&wide);
        for (int i = 0; i < n; i++) {
            fr_tensor *got = fr_st_get(f, names[i], FR_CPU, FR_TAG_DATA);
            CHECK_NOTNULL(got);
            if (i == 8) {
                /* the strided view comes back contiguous, same values */
                fr_tensor *w2 = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 4), 3);
                fr_tensor *v = fr_narrow(w2, 1, 1, 2);
                CHECK(same_bytes(got, v));
                fr_release(v);
                fr_release(w2);
            } else if (!same_bytes(got, ts[i])) {
                fprintf(stderr, "    tensor %s differs after the round trip\n", names[i]);
                fr_t_failed_now = 1;
            }
            fr_release(got);
        }
        CHECK(fr_st_get(f, "absent", FR_CPU, FR_TAG_DATA) == NULL);
        CHECK_ERR(fr_last_status(), FR_ERR_ARG, path);
        CHECK(strstr(fr_last_error(), "absent") != NULL);
        fr_st_close(f);
    }
    /* An empty writer gives a valid file with no tensors. */
    w = fr_st_writer_new();
    CHECK_OK(fr_st_writer_save(w, path));
    fr_st_writer_free(w);
    f = fr_st_open(path);
    CHECK(f && fr_st_count(f) == 0);
    fr_st_close(f);
    for (int i = 0; i < n - 1; i++)
        if (i != 8)
            fr_release(ts[i]);
    remove_tmpdir();
}

static void test_read_into(void) {
    char path[512];
    make_tmpdir();
    tmp_path(path, sizeof path, "ri.safetensors");
    fr_tensor *a = fr_t_rand(FR_CPU, 2, FR_SHAPE(2, 3), 5);
    fr_st_writer *w = fr_st_writer_new();
    CHECK_OK(fr_st_writer_add(w, "a", a));
    CHECK_OK(fr_st_writer_save(w, path));
    fr_st_writer_free(w);
    fr_st_file *f = fr_st_open(path);
    CHECK_NOTNULL(f);

    fr_tensor *dst = fr_zeros(FR_CPU, FR_F32, 2, FR_SHAPE(2, 3), FR_TAG_PARAM);
    uint64_t v0 = dst->storage->version;
    CHECK_OK(fr_st_read_into(f, "a", dst));
    CHECK(same_bytes(dst, a));
    CHECK(dst->storage->version > v0);

    /* into a strided destination */
    fr_tensor *big = fr_zeros(FR_CPU, FR_F32, 2, FR_SHAPE(2, 5), FR_TAG_PARAM);
    fr_tensor *part = fr_narrow(big, 1, 1, 3);
    CHECK_OK(fr_st_read_into(f, "a", part));
    CHECK(same_bytes(part, a));
    CHECK(fr_data_f32(big)[0] == 0.0f && fr_data_f32(big)[4] == 0.0f);

    fr_tensor *wrong_shape = fr_zeros(FR_CPU, FR_F32, 2, FR_SHAPE(3, 2), FR_TAG_PARAM);
    CHECK_ERR(fr_st_read_into(f, "a", wrong_shape), FR_ERR_SHAPE, "(2, 3)");
    CHECK(strstr(fr_last_error(), "(3, 2)") && strstr(fr_last_error(), path) &&
          strstr(fr_last_error(), "'a'"));
    fr_tensor *wrong_dtype = fr_zeros(FR_CPU, FR_I32, 2, FR_SHAPE(2, 3), FR_TAG_PARAM);
    CHECK_ERR(fr_st_read_into(f, "a", wrong_dtype), FR_ERR_DTYPE, path);
    CHECK(strstr(fr_last_error(), "F32") && strstr(fr_last_error(), "i32"));
    CHECK_ERR(fr_st_read_into(f, "nope", dst), FR_ERR_ARG, "nope");

    fr_release(a);
    fr_release(dst);
    fr_release(part);
    fr_release(big);
    fr_release(wrong_shape);
    fr_release(wrong_dtype);
    fr_st_close(f);
    remove_tmpdir();
}

/* ---- malformed files ---- */

typedef struct {
    const char *what;
    const char *header;   /* header text; its length goes in the length field */
    size_t ndata;         /* zero bytes of data after it */
    const char *needle;   /* expected in the message besides the path */
} bad_case;

static void expect_open_fails(const char *path, const char *what, const char *needle) {
    fr_clear_error();
    fr_st_file *f = fr_st_open(path);
    fr_status s = fr_last_status();
    if (f || (s != FR_ERR_FORMAT && s != FR_ERR_IO) || !strstr(fr_last_error(), path) ||
        (needle && !strstr(fr_last_error(), needle))) {
        fprintf(stderr, "    %s: open gave %s \"%s\" (expected format/io error naming the file%s%s)\n",
                what, f ? "a file" : fr_status_name(s), fr_last_error(), needle ? " and " : "",
                needle ? needle : "");
        fr_t_failed_now = 1;
    }
    fr_st_close(f);
}

static void test_malformed(void) {
    char path[512];
    make_tmpdir();
    tmp_path(path, sizeof path, "bad.safetensors");
    static const bad_case cases[] = {
        {"cut-off JSON", "{\"a\":{\"dtype\":\"F32\"", 0, "unexpected end"},
        {"bare word", "{\"a\":{\"dtype\":F32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "byte"},
        {"trailing comma", "{\"a\":1,}", 0, "byte"},
        {"float in shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,4]}}", 4, "integer"},
        {"leading zero", "{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "leading zero"},
        {"bad escape", "{\"a\\q\":{}}", 0, "escape"},
        {"lone surrogate", "{\"\\ud800\":{}}", 0, "surrogate"},
        {"raw control char", "{\"a\nb\":{}}", 0, "control"},
        {"trailing garbage", "{} x", 0, "trailing"},
        {"root not an object", "[1, 2]", 0, "not a JSON object"},
        {"huge integer", "{\"a\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,1]}}", 1, "too large"},
        {"deep nesting", "{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}", 0, "deep"},
        {"offsets past the end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "pass the end"},
        {"overlapping offsets",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap"},
        {"gap between tensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "gap"},
        {"trailing data bytes", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "trailing"},
        {"end before begin", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, "before begin"},
        {"shape/bytes mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "need 12"},
        {"unknown dtype", "{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype \"F33\""},
        {"missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "missing field \"dtype\""},
        {"unknown field", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "unknown field"},
        {"negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, ">= 0"},
        {"six dims", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "at most 5"},
        {"one offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "data_offsets"},
        {"empty tensor name", "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "empty name"},
        {"duplicate names",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "twice"},
        {"entry not an object", "{\"a\":[1]}", 0, "not an object"},
    };
    static unsigned char zeros[64];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        write_st(path, strlen(cases[c].header), cases[c].header, zeros, cases[c].ndata);
        expect_open_fails(path, cases[c].what, cases[c].needle);
    }

    /* length fields that do not fit the file */
    write_bytes(path, "\x05\0\0", 3);
    expect_open_fails(path, "3-byte file", "too short");
    write_st(path, 1000, "{}      ", NULL, 0);
    expect_open_fails(path, "header length past EOF", "header length");
    write_st(path, UINT64_MAX, "{}      ", NULL, 0);
    expect_open_fails(path, "absurd header length", "header length");
    write_st(path, 0, "", NULL, 0);
    expect_open_fails(path, "zero header length", "header length");
    tmp_path(path, sizeof path, "missing.safetensors");
    expect_open_fails(path, "missing file", NULL);
    CHECK(fr_last_status() == FR_ERR_IO);
    remove_tmpdir();
}

static void test_unsupported_dtype(void) {
    char path[512];
    make_tmpdir();
    tmp_path(path, sizeof path, "i64.safetensors");
    static const unsigned char data[16] = {7};
    const char *hdr = "{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}";
    write_st(path, strlen(hdr), hdr, data, 16);
    /* A file holding a dtype frugal cannot hold still opens (PyTorch's
     * BatchNorm num_batches_tracked is int64); asking for it fails. */
    fr_st_file *f = fr_st_open(path);
    CHECK_NOTNULL(f);
    if (f) {
        CHECK(fr_st_count(f) == 2 && fr_st_dtype(f, 0) == FR_DTYPE_COUNT);
        CHECK(fr_st_get(f, "a", FR_CPU, FR_TAG_DATA) == NULL);
        CHECK_ERR(fr_last_status(), FR_ERR_DTYPE, "unsupported dtype I64");
        CHECK(strstr(fr_last_error(), "'a'") && strstr(fr_last_error(), path));
        fr_tensor *b = fr_st_get(f, "b", FR_CPU, FR_TAG_DATA);
        CHECK(b && fr_numel(b) == 2);
        fr_release(b);
        /* ... but it reads into an i32 tensor of its shape, and only that */
        CHECK(fr_st_is_i64(f, 0) && !fr_st_is_i64(f, 1));
        fr_tensor *a = fr_zeros(FR_CPU, FR_I32, 1, FR_SHAPE(1), FR_TAG_DATA);
        CHECK_OK(fr_st_read_into(f, "a", a));
        CHECK(*(int32_t *)fr_data(a) == 7);
        fr_tensor *a2 = fr_zeros(FR_CPU, FR_I32, 1, FR_SHAPE(2), FR_TAG_DATA);
        CHECK_ERR(fr_st_read_into(f, "a", a2), FR_ERR_SHAPE, "'a'");
        fr_tensor *af = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(1), FR_TAG_DATA);
        CHECK_ERR(fr_st_read_into(f, "a", af), FR_ERR_DTYPE, "unsupported dtype I64");
        fr_release(a);
        fr_release(a2);
        fr_release(af);
        fr_st_close(f);
    }
    remove_tmpdir();
}

/* PyTorch's int64 num_batches_tracked loads into frugal's i32 counter, with a
 * range check that fails before anything is copied; a negative count, in
 * range or not, is refused too (fr_params_check_stats). */
static void test_i64_counter_range(void) {
    char path[512];
    make_tmpdir();
    tmp_path(path, sizeof path, "counter.safetensors");
    const char *hdr = "{\"bn.num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
                      "\"bn.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}";
    int64_t values[] = {2147483647, (int64_t)1 << 40, -2147483648LL, -2147483649LL};
    for (int v = 0; v < 4; v++) {
        unsigned char data[12] = {0};
        memcpy(data, &values[v], 8);
        float w = 1.5f;
        memcpy(data + 8, &w, 4);
        write_st(path, strlen(hdr), hdr, data, 12);
        fr_params *p = fr_params_new();
        fr_tensor *count = fr_params_new_tensor(p, "bn.num_batches_tracked", FR_BUFFER, FR_I32, 0, NULL);
        fr_tensor *wt = fr_params_new_tensor(p, "bn.w", FR_PARAMETER, FR_F32, 1, FR_SHAPE(1));
        bool counts = values[v] >= 0 && values[v] <= INT32_MAX;
        if (counts) {
            CHECK_OK(fr_params_load(p, path));
            CHECK(*(int32_t *)fr_data(count) == (int32_t)values[v] && fr_data_f32(wt)[0] == 1.5f);
        } else {
            char want[32];
            snprintf(want, sizeof want, "holds %lld", (long long)values[v]);
            CHECK_ERR(fr_params_load(p, path), FR_ERR_FORMAT, want);
            CHECK(strstr(fr_last_error(), "bn.num_batches_tracked") != NULL);
            CHECK(*(int32_t *)fr_data(count) == 0 && fr_data_f32(wt)[0] == 0); /* nothing copied */
        }
        fr_params_free(p);
    }
    remove_tmpdir();
}

/* ---- atomic saves ---- */

static fr_status save_one(const char *path, const char *name, fr_tensor *t) {
    fr_st_writer *w = fr_st_writer_new();
    fr_status s = fr_st_writer_add(w, name, t);
    if (s == FR_OK)
        s = fr_st_writer_save(w, path);
    fr_st_writer_free(w);
    return s;
}

static void test_atomic_save(void) {
    char path[512], bad[512];
    make_tmpdir();
    tmp_path(path, sizeof path, "ck.safetensors");
    fr_tensor *a = fr_t_rand(FR_CPU, 1, FR_SHAPE(4), 11);
    fr_tensor *b = fr_t_rand(FR_CPU, 2, FR_SHAPE(2, 2), 12);

    tmp_path(bad, sizeof bad, "no/such/dir/x.safetensors");
    CHECK_ERR(save_one(bad, "a", a), FR_ERR_IO, bad);

    /* saving over an existing file replaces it */
    CHECK_OK(save_one(path, "a", a));
    CHECK_OK(save_one(path, "b", b));
    fr_st_file *f = fr_st_open(path);
    CHECK(f && fr_st_count(f) == 1 && fr_st_find(f, "b") == 0);
    fr_st_close(f);

    /* a save that fails part-way (the strided tensor cannot be made
     * contiguous under a memory cap) leaves the old file byte-identical */
    size_t n_before, n_after;
    unsigned char *before = read_all(path, &n_before);
    fr_tensor *wide = fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 8), 13);
    fr_tensor *strided = fr_narrow(wide, 1, 2, 4);  // (4, 4), strided
    fr_st_writer *w = fr_st_writer_new();
    CHECK_OK(fr_st_writer_add(w, "a_first", a));
    CHECK_OK(fr_st_writer_add(w, "b_strided", strided));
    fr_mem_set_limit(FR_CPU, fr_mem_total_current(FR_CPU));
    CHECK_ERR(fr_st_writer_save(w, path), FR_ERR_OOM, path);
    CHECK(strstr(fr_last_error(), "b_strided") != NULL);
    fr_mem_set_limit(FR_CPU, 0);
    fr_st_writer_free(w);
    unsigned char *after = read_all(path, &n_after);
    CHECK(before && after && n_before == n_after && !memcmp(before, after, n_before));
    CHECK(count_temp_files() == 0);
    free(before);
    free(after);

    /* rename onto a directory fails; no temp file stays behind */
    tmp_path(bad, sizeof bad, "adir");
    CHECK(mkdir(bad, 0700) == 0);
    CHECK_ERR(save_one(bad, "a", a), FR_ERR_IO, bad);
    CHECK(count_temp_files() == 0);

    /* writer argument errors */
    w = fr_st_writer_new();
    CHECK_OK(fr_st_writer_add(w, "x", a));
    CHECK_ERR(fr_st_writer_add(w, "x", b), FR_ERR_ARG, "twice");
    CHECK_ERR(fr_st_writer_add(w, "__metadata__", b), FR_ERR_ARG, "__metadata__");
    CHECK_ERR(fr_st_writer_add(w, "y", NULL), FR_ERR_ARG, "NULL");
    CHECK_OK(fr_st_writer_add_metadata(w, "k", "v"));
    CHECK_ERR(fr_st_writer_add_metadata(w, "k", "w"), FR_ERR_ARG, "twice");
    fr_st_writer_free(w);

    fr_release(strided);
    fr_release(wide);
    fr_release(a);
    fr_release(b);
    remove_tmpdir();
}

/* ---- PyTorch interop ---- */

static void test_pytorch_interop(void) {
    fr_st_file *f = fr_t_fixture("interop");
    if (!f)
        return;
    CHECK(!strcmp(fr_st_metadata(f, "format"), "pt"));

    float want[24];
    for (int i = 0; i < 12; i++)
        want[i] = (float)i / 8.0f - 0.5f;
    fr_tensor *t = fr_t_fixture_tensor(f, "f32", FR_CPU);
    CHECK(t && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 4);
    fr_t_allclose(t, want, 12, 0, 0, "f32");
    fr_release(t);

    /* half types: exact for representable values, f16 rounding for 1e-4 */
    const float h[6] = {0.5f, -1.25f, 65504.0f, 1e-4f, 0.0f, -0.0f};
    fr_tensor *t16 = fr_t_fixture_tensor(f, "f16", FR_CPU);
    t = t16 ? fr_to_dtype(t16, FR_F32, FR_TAG_DATA) : NULL;
    fr_t_allclose(t, h, 6, 0, 1e-3, "f16");
    CHECK(t16 && ((uint16_t *)fr_data(t16))[5] == 0x8000);
    fr_release(t);
    fr_release(t16);
    const float bf[4] = {1.0f, -2.5f, 3.140625f, 1e30f};
    t16 = fr_t_fixture_tensor(f, "bf16", FR_CPU);
    t = t16 ? fr_to_dtype(t16, FR_F32, FR_TAG_DATA) : NULL;
    fr_t_allclose(t, bf, 4, 0, 4e-3, "bf16");
    fr_release(t);
    fr_release(t16);

    t = fr_t_fixture_tensor(f, "i32", FR_CPU);
    CHECK(t && t->dtype == FR_I32 && fr_numel(t) == 7);
    for (int i = 0; t && i < 7; i++)
        CHECK(((int32_t *)fr_data(t))[i] == i - 3);
    fr_release(t);
    t = fr_t_fixture_tensor(f, "u8", FR_CPU);
    CHECK(t && t->dtype == FR_U8 && t->ndim == 2 && t->shape[1] == 7);
    for (int i = 0; t && i < 7; i++)
        CHECK(((uint8_t *)fr_data(t))[i] == 37 * i);
    fr_release(t);

    t = fr_t_fixture_tensor(f, "scalar", FR_CPU);
    CHECK(t && t->ndim == 0 && fr_item(t) == 2.75f);
    fr_release(t);
    t = fr_t_fixture_tensor(f, "empty", FR_CPU);
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 3);
    fr_release(t);
    for (int i = 0; i < 24; i++)
        want[i] = (float)i;
    t = fr_t_fixture_tensor(f, "nd5", FR_CPU);
    CHECK(t && t->ndim == 5 && t->shape[3] == 4);
    fr_t_allclose(t, want, 24, 0, 0, "nd5");
    fr_release(t);

    /* the random weight: its sum as PyTorch computed it in double */
    t = fr_t_fixture_tensor(f, "layer1.0.conv1.weight", FR_CPU);
    const char *sum_text = fr_st_metadata(f, "rand_sum");
    CHECK(t && sum_text && fr_numel(t) == 108);
    if (t && sum_text) {
        double sum = 0;
        for (int i = 0; i < 108; i++)
            sum += fr_data_f32(t)[i];
        CHECK_CLOSE(sum, strtod(sum_text, NULL), 1e-9);
    }
    fr_release(t);

    CHECK(fr_st_get(f, "num_batches_tracked", FR_CPU, FR_TAG_DATA) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_DTYPE, "num_batches_tracked");
    fr_st_close(f);
}

/* ---- the `safetensors` package itself ---- */

/* Why PyTorch's `safetensors` package cannot run here, or NULL when it can:
 * Debian's python3-torch plus the wheel scripts/install-deps.sh puts in
 * .pydeps (paths relative to the repo root, where tests run). */
static const char *package_missing(void) {
    if (access("/usr/bin/python3", X_OK) != 0)
        return "no /usr/bin/python3";
    /* one probe when all is there (importing torch takes a second) */
    if (system("/usr/bin/python3 -c \"import sys; sys.path.insert(0, '.pydeps'); "
               "import safetensors.torch\" >/dev/null 2>&1") == 0)
        return NULL;
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        return "/usr/bin/python3 has no torch (apt install python3-torch)";
    return "no safetensors package in .pydeps (make deps installs it)";
}

/* f32 values i * scale + offset, as a new tensor. */
static fr_tensor *ramp(fr_dtype dtype, int ndim, const int64_t *shape, float scale,
                       float offset) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)i * scale + offset;
    fr_tensor *t = fr_from_host(FR_CPU, FR_F32, ndim, shape, FR_TAG_DATA, v);
    free(v);
    if (dtype != FR_F32) {
        fr_tensor *c = fr_to_dtype(t, dtype, FR_TAG_DATA);
        fr_release(t);
        t = c;
    }
    return t;
}

/* The package-written entry `name` as f32 values (converted from its dtype),
 * checked to have `dtype` and `ndim` dims; NULL (test failed) otherwise. */
static fr_tensor *get_f32(fr_st_file *f, const char *name, fr_dtype dtype, int ndim) {
    fr_tensor *t = fr_st_get(f, name, FR_CPU, FR_TAG_DATA);
    CHECK_NOTNULL(t);
    if (!t)
        return NULL;
    if (t->dtype != dtype || t->ndim != ndim) {
        fprintf(stderr, "    %s: dtype %s, %d dims; want %s, %d\n", name,
                fr_dtype_name(t->dtype), t->ndim, fr_dtype_name(dtype), ndim);
        fr_t_failed_now = 1;
        fr_release(t);
        return NULL;
    }
    fr_tensor *c = fr_to_dtype(t, FR_F32, FR_TAG_DATA);
    fr_release(t);
    return c;
}

/* frugal writes a file, PyTorch's `safetensors` package loads it and checks
 * every value (tests/fixtures/check_interop.py), then saves tensors and a
 * torch module's state dict with safetensors.torch.save_file, which frugal
 * reads back here. All values are exact (representable in every dtype). */
static void test_safetensors_package(void) {
    const char *why = package_missing();
    if (why)
        SKIP(why);
    char in[512], out[512], cmd[1400];
    make_tmpdir();
    tmp_path(in, sizeof in, "from_frugal.safetensors");
    tmp_path(out, sizeof out, "from_package.safetensors");

    /* the formulas of frugal_expected() in check_interop.py */
    fr_tensor *f32 = ramp(FR_F32, 2, FR_SHAPE(3, 4), 1.0f / 8, -0.5f);
    fr_tensor *f16 = ramp(FR_F16, 2, FR_SHAPE(2, 3), 0.25f, -0.625f);
    fr_tensor *bf16 = ramp(FR_BF16, 1, FR_SHAPE(5), 1.5f, -3.0f);
    int32_t iv[7];
    for (int i = 0; i < 7; i++)
        iv[i] = i * -123456 + 7;
    fr_tensor *i32 = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(7), FR_TAG_DATA, iv);
    uint8_t uv[8];
    for (int i = 0; i < 8; i++)
        uv[i] = (uint8_t)(37 * i % 256);
    fr_tensor *u8 = fr_from_host(FR_CPU, FR_U8, 2, FR_SHAPE(2, 4), FR_TAG_DATA, uv);
    float sv = -3.5f;
    fr_tensor *scalar = fr_from_host(FR_CPU, FR_F32, 0, NULL, FR_TAG_DATA, &sv);
    float cv[108];  // (4, 3, 3, 3)
    for (int i = 0; i < 108; i++)
        cv[i] = (float)(i % 17) / 16.0f - 0.5f;
    fr_tensor *conv = fr_from_host(FR_CPU, FR_F32, 4, FR_SHAPE(4, 3, 3, 3), FR_TAG_DATA, cv);
    fr_tensor *wide = ramp(FR_F32, 2, FR_SHAPE(3, 4), 1.0f, 0.0f);
    fr_tensor *strided = fr_narrow(wide, 1, 1, 2);  // (3, 2), not contiguous

    fr_st_writer *w = fr_st_writer_new();
    CHECK_OK(fr_st_writer_add(w, "f32", f32));
    CHECK_OK(fr_st_writer_add(w, "f16", f16));
    CHECK_OK(fr_st_writer_add(w, "bf16", bf16));
    CHECK_OK(fr_st_writer_add(w, "i32", i32));
    CHECK_OK(fr_st_writer_add(w, "u8", u8));
    CHECK_OK(fr_st_writer_add(w, "scalar", scalar));
    CHECK_OK(fr_st_writer_add(w, "layer1.0.conv1.weight", conv));
    CHECK_OK(fr_st_writer_add(w, "strided", strided));
    CHECK_OK(fr_st_writer_add_metadata(w, "format", "pt"));
    CHECK_OK(fr_st_writer_add_metadata(w, "writer", "frugal"));
    CHECK_OK(fr_st_writer_add_metadata(w, "note", "quote \" backslash \\ done"));
    CHECK_OK(fr_st_writer_save(w, in));
    fr_st_writer_free(w);
    fr_tensor *mine[] = {f32, f16, bf16, i32, u8, scalar, conv, strided, wide};
    for (size_t i = 0; i < sizeof mine / sizeof *mine; i++)
        fr_release(mine[i]);

    /* check_interop.py prints what differs on stderr and exits non-zero */
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/fixtures/check_interop.py '%s' '%s'", in,
             out);
    int rc = system(cmd);
    if (rc != 0) {
        fprintf(stderr, "    %s -> exit %d: the package rejected frugal's file\n", cmd,
                WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
        fr_t_failed_now = 1;
    }

    fr_st_file *f = fr_st_open(out);
    CHECK_NOTNULL(f);
    if (!f) {
        remove_tmpdir();
        return;
    }
    CHECK(fr_st_count(f) == 10);
    CHECK(!strcmp(fr_st_metadata(f, "format"), "pt"));
    CHECK(!strcmp(fr_st_metadata(f, "epoch"), "3"));
    CHECK(!strncmp(fr_st_metadata(f, "writer"), "safetensors ", 12));

    /* the formulas of package_written() in check_interop.py, exact */
    float want[54];
    fr_tensor *t = get_f32(f, "w.f32", FR_F32, 2);
    for (int i = 0; i < 10; i++)
        want[i] = (float)i * 0.75f - 2.0f;
    CHECK(t && t->shape[0] == 2 && t->shape[1] == 5);
    fr_t_allclose(t, want, 10, 0, 0, "w.f32");
    fr_release(t);
    t = get_f32(f, "w.f16", FR_F16, 1);
    for (int i = 0; i < 4; i++)
        want[i] = (float)i * -0.375f + 1.0f;
    fr_t_allclose(t, want, 4, 0, 0, "w.f16");
    fr_release(t);
    t = get_f32(f, "w.bf16", FR_BF16, 2);
    for (int i = 0; i < 6; i++)
        want[i] = ((float)i - 3.0f) * 0.5f;
    CHECK(t && t->shape[0] == 3 && t->shape[1] == 2);
    fr_t_allclose(t, want, 6, 0, 0, "w.bf16");
    fr_release(t);
    t = get_f32(f, "w.scalar", FR_F32, 0);
    CHECK(t && fr_item(t) == 1.25f);
    fr_release(t);
    t = get_f32(f, "w.conv", FR_F32, 4);
    for (int i = 0; i < 54; i++)
        want[i] = (float)i / 32.0f - 0.75f;
    CHECK(t && t->shape[0] == 2 && t->shape[1] == 3 && t->shape[2] == 3 && t->shape[3] == 3);
    fr_t_allclose(t, want, 54, 0, 0, "w.conv");
    fr_release(t);

    t = fr_st_get(f, "w.i32", FR_CPU, FR_TAG_DATA);
    CHECK(t && t->dtype == FR_I32 && t->ndim == 1 && t->shape[0] == 6);
    for (int i = 0; t && i < 6; i++)
        CHECK(((int32_t *)fr_data(t))[i] == i * -1001 + 17);
    fr_release(t);
    t = fr_st_get(f, "w.u8", FR_CPU, FR_TAG_DATA);
    CHECK(t && t->dtype == FR_U8 && t->ndim == 1 && t->shape[0] == 3);
    for (int i = 0; t && i < 3; i++)
        CHECK(((uint8_t *)fr_data(t))[i] == 255 - 100 * i);
    fr_release(t);

    /* nn.Linear(3, 2)'s random weight: its sum as PyTorch computed it in double */
    t = get_f32(f, "fc.weight", FR_F32, 2);
    const char *sum_text = fr_st_metadata(f, "fc_weight_sum");
    CHECK(t && sum_text && t->shape[0] == 2 && t->shape[1] == 3);
    if (t && sum_text) {
        double sum = 0;
        for (int i = 0; i < 6; i++)
            sum += fr_data_f32(t)[i];
        CHECK_CLOSE(sum, strtod(sum_text, NULL), 1e-9);
    }
    fr_release(t);
    fr_tensor *bias = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(2), FR_TAG_PARAM);
    CHECK_OK(fr_st_read_into(f, "fc.bias", bias));
    fr_release(bias);
    /* BatchNorm's int64 counter: no i64 tensor in frugal, but it reads into
     * the i32 counter frugal keeps (7 batches, from package_written()) */
    int k = fr_st_find(f, "bn.num_batches_tracked");
    CHECK(k >= 0 && fr_st_dtype(f, k) == FR_DTYPE_COUNT && fr_st_ndim(f, k) == 0);
    CHECK(fr_st_get(f, "bn.num_batches_tracked", FR_CPU, FR_TAG_DATA) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_DTYPE, "I64");
    fr_tensor *count = fr_zeros(FR_CPU, FR_I32, 0, NULL, FR_TAG_DATA);
    CHECK_OK(fr_st_read_into(f, "bn.num_batches_tracked", count));
    CHECK(*(int32_t *)fr_data(count) == 7);
    fr_release(count);
    fr_st_close(f);
    remove_tmpdir();
}

static void test_cuda_round_trip(void) {
    if (!fr_t_have_cuda())
        SKIP("no CUDA device");
    char path[512];
    make_tmpdir();
    tmp_path(path, sizeof path, "cuda.safetensors");
    fr_tensor *h = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 5), 21);
    fr_tensor *d = fr_to_device(h, FR_CUDA, FR_TAG_DATA);
    CHECK_OK(save_one(path, "w", d));
    fr_st_file *f = fr_st_open(path);
    fr_tensor *back = f ? fr_st_get(f, "w", FR_CUDA, FR_TAG_DATA) : NULL;
    fr_tensor *dst = fr_zeros(FR_CUDA, FR_F32, 2, FR_SHAPE(3, 5), FR_TAG_PARAM);
    CHECK(back && fr_device_of(back) == FR_CUDA);
    fr_t_allclose_t(back, h, 0, 0, "cuda get");
    CHECK_OK(fr_st_read_into(f, "w", dst));
    fr_t_allclose_t(dst, h, 0, 0, "cuda read_into");
    fr_release(dst);
    fr_release(back);
    fr_release(d);
    fr_release(h);
    fr_st_close(f);
    remove_tmpdir();
}

/* ---- checksums ---- */

/* zlib's CRC-32 of the bytes s points to, n of them (0-bytes included). */
static uint32_t crc_of(uint32_t crc, const void *s, size_t n) { return (uint32_t)crc32(crc, s, (uInt)n); }

/* The field's text is what safetensors.h defines, computed here from the
 * definition alone; a changed byte anywhere it covers is refused naming the
 * file and, for data, the tensor, and only the damaged tensor is refused. */
static void test_checksums(void) {
    char path[512];
    make_tmpdir();
    tmp_path(path, sizeof path, "crc.safetensors");
    float bv[6] = {0.5f, -1.25f, 3.0f, 7.5f, -0.0f, 1e-3f};
    int32_t av = -42;
    fr_tensor *b = fr_from_host(FR_CPU, FR_F32, 2, FR_SHAPE(2, 3), FR_TAG_DATA, bv);
    fr_tensor *a = fr_from_host(FR_CPU, FR_I32, 0, NULL, FR_TAG_DATA, &av);
    fr_st_writer *w = fr_st_writer_new();
    CHECK_OK(fr_st_writer_add(w, "b", b));
    CHECK_OK(fr_st_writer_add(w, "a", a));
    CHECK_OK(fr_st_writer_add_metadata(w, "k2", "v2"));
    CHECK_OK(fr_st_writer_add_metadata(w, "k1", "v1"));
    CHECK_ERR(fr_st_writer_add_metadata(w, FR_ST_CHECKSUM_KEY, "0"), FR_ERR_ARG, "reserved");
    CHECK_OK(fr_st_writer_save(w, path));
    fr_st_writer_free(w);
    /* metadata: keys sorted, key 0 value 0; a tensor: name 0 dtype 0 shape 0 data */
    uint32_t meta = crc_of(0, "k1\0v1\0k2\0v2\0", 12);
    uint32_t ca = crc_of(crc_of(0, "a\0I32\0\0", 7), &av, 4);
    uint32_t cb = crc_of(crc_of(0, "b\0F32\0" "2,3\0", 10), bv, sizeof bv);
    char want[64];
    snprintf(want, sizeof want, "%08x %08x %08x", (unsigned)meta, (unsigned)ca, (unsigned)cb);
    fr_st_file *f = fr_st_open(path);
    CHECK_NOTNULL(f);
    const char *got = f ? fr_st_metadata(f, FR_ST_CHECKSUM_KEY) : NULL;
    if (!got || strcmp(got, want)) {
        fprintf(stderr, "    " FR_ST_CHECKSUM_KEY " is \"%s\", the definition gives \"%s\"\n", got ? got : "(none)",
                want);
        fr_t_failed_now = 1;
    }
    CHECK_OK(fr_st_verify(f, "a"));
    CHECK_ERR(fr_st_verify(f, "c"), FR_ERR_ARG, "no tensor named 'c'");
    fr_st_close(f);

    size_t n;
    char *good = fr_t_read_file(path, &n);
    CHECK_NOTNULL(good);
    /* one bit of b: the file opens (its header is whole), a reads, b is refused */
    CHECK(fr_t_st_flip(path, "b", 5));
    f = fr_st_open(path);
    CHECK_NOTNULL(f);
    if (f) {
        fr_tensor *t = fr_st_get(f, "a", FR_CPU, FR_TAG_DATA);
        CHECK(t && *(int32_t *)fr_data(t) == -42);
        fr_release(t);
        CHECK_ERR(fr_st_verify(f, "b"), FR_ERR_FORMAT, "tensor 'b': its bytes do not match their checksum");
        CHECK(strstr(fr_last_error(), path) != NULL);
        CHECK(fr_st_get(f, "b", FR_CPU, FR_TAG_DATA) == NULL);
        CHECK_ERR(fr_last_status(), FR_ERR_FORMAT, "tensor 'b'");
        fr_tensor *dst = fr_zeros(FR_CPU, FR_F32, 2, FR_SHAPE(2, 3), FR_TAG_DATA);
        CHECK_ERR(fr_st_read_into(f, "b", dst), FR_ERR_FORMAT, "tensor 'b'");
        fr_release(dst);
        fr_st_close(f);
    }
    /* same-length edits of the header, each refused: a metadata value, a
     * tensor's name (its CRC covers the name), a value that is no longer a
     * string, the field's own digits */
    static const struct {
        const char *from, *to, *needle;
    } edits[] = {
        {"\"v1\"", "\"v9\"", "the __metadata__ does not match its checksum"},
        {"\"b\":{", "\"c\":{", "tensor 'c': its bytes do not match their checksum"},
        {"\"k1\":\"v1\"", "\"k1\":null", "metadata field \"k1\" is null"},
        {"\"" FR_ST_CHECKSUM_KEY "\":\"", "\"" FR_ST_CHECKSUM_KEY "\":\"A", "is not 3 CRC-32s of 8 lowercase hex"},
    };
    for (size_t k = 0; k < sizeof edits / sizeof *edits; k++) {
        char *copy = malloc(n);
        memcpy(copy, good, n);
        char *at = memmem(copy, n, edits[k].from, strlen(edits[k].from));
        CHECK_NOTNULL(at);
        if (at) {
            memcpy(at, edits[k].to, strlen(edits[k].to)); /* the last one writes over a digit */
            CHECK(fr_t_write_file(path, copy, n));
            f = fr_st_open(path);
            if (f) { /* a header that opens fails at the read of its damaged tensor */
                fr_release(fr_st_get(f, "c", FR_CPU, FR_TAG_DATA));
                fr_st_close(f);
            }
            CHECK_ERR(fr_last_status(), FR_ERR_FORMAT, edits[k].needle);
            CHECK(strstr(fr_last_error(), path) != NULL);
        }
        free(copy);
    }
    /* without the field it reads as before, damage and all */
    CHECK(fr_t_write_file(path, good, n) && fr_t_st_unseal(path) && fr_t_st_flip(path, "b", 5));
    f = fr_st_open(path);
    fr_tensor *t = f ? fr_st_get(f, "b", FR_CPU, FR_TAG_DATA) : NULL;
    CHECK(f && !fr_st_metadata_kind(f, FR_ST_CHECKSUM_KEY) && fr_st_metadata_count(f) == 2);
    CHECK(t && memcmp(fr_data(t), bv, sizeof bv));
    CHECK_OK(f ? fr_st_verify(f, "b") : FR_ERR_ARG);
    fr_release(t);
    fr_st_close(f);
    free(good);
    fr_release(a);
    fr_release(b);
    remove_tmpdir();
}

int main(void) {
    RUN(test_round_trip);
    RUN(test_read_into);
    RUN(test_malformed);
    RUN(test_unsupported_dtype);
    RUN(test_i64_counter_range);
    RUN(test_atomic_save);
    RUN(test_checksums);
    RUN(test_pytorch_interop);
    RUN(test_safetensors_package);
    RUN(test_cuda_round_trip);
    return TEST_SUMMARY();
}
