/* test_tensor.c: tensors, views, copies, dtype conversion, argument errors. */
#include <string.h>

#include "testlib.h"

static void test_create_and_shape(void) {
    fr_tensor *t = fr_zeros(FR_CPU, FR_F32, 4, FR_SHAPE(2, 3, 4, 5), FR_TAG_TRANSIENT);
    CHECK_NOTNULL(t);
    if (!t)
        return;
    CHECK(fr_numel(t) == 120);
    CHECK(fr_nbytes(t) == 480);
    CHECK(fr_is_contiguous(t));
    CHECK(t->stride[0] == 60 && t->stride[3] == 1);
    char buf[64];
    CHECK(strcmp(fr_shape_str(t, buf, sizeof buf), "(2, 3, 4, 5)") == 0);
    float host[120];
    CHECK_OK(fr_read_f32(t, host, 120));
    float zero[120] = {0};
    CHECK(memcmp(host, zero, sizeof host) == 0);
    fr_release(t);
    fr_release(NULL); /* accepted */
}

static void test_from_host_and_item(void) {
    float v[3] = {1.5f, -2.0f, 3.25f};
    fr_tensor *t = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE(3), FR_TAG_DATA, v);
    CHECK_NOTNULL(t);
    fr_tensor *s = fr_narrow(t, 0, 2, 1);
    CHECK_CLOSE(fr_item(s), 3.25, 0);
    CHECK_OK(fr_fill_(t, 7.0f));
    CHECK_CLOSE(fr_item(s), 7.0, 0);
    fr_release(s);
    fr_release(t);
}

static void test_views(void) {
    float v[24];
    for (int i = 0; i < 24; i++)
        v[i] = (float)i;
    fr_tensor *t = fr_from_host(FR_CPU, FR_F32, 3, FR_SHAPE(2, 3, 4), FR_TAG_DATA, v);
    fr_tensor *r = fr_view(t, 2, FR_SHAPE(-1, 4));
    CHECK_NOTNULL(r);
    CHECK(r && r->shape[0] == 6 && r->shape[1] == 4);
    CHECK(r && r->storage == t->storage);
    /* narrow on dim 1 is strided: channels 1..2 of each sample */
    fr_tensor *n = fr_narrow(t, 1, 1, 2);
    CHECK_NOTNULL(n);
    CHECK(n && !fr_is_contiguous(n));
    fr_tensor *c = n ? fr_contiguous(n, FR_TAG_TRANSIENT) : NULL;
    float want[16] = {4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23};
    fr_t_allclose(c, want, 16, 0, 0, "narrow(1) contiguous");
    /* reading a strided view directly gives the same values */
    float got[16];
    CHECK_OK(fr_read_f32(n, got, 16));
    CHECK(memcmp(got, want, sizeof want) == 0);
    CHECK_ERR(fr_t_status_of(fr_view(n, 1, FR_SHAPE(16))), FR_ERR_SHAPE, "not contiguous");
    CHECK_ERR(fr_t_status_of(fr_view(t, 2, FR_SHAPE(5, 5))), FR_ERR_SHAPE, "cannot view (2, 3, 4)");
    CHECK_ERR(fr_t_status_of(fr_narrow(t, 1, 2, 2)), FR_ERR_SHAPE, "outside dimension 1");
    CHECK_ERR(fr_t_status_of(fr_narrow(t, 2, 0, 1)), FR_ERR_ARG, "dims 0 and 1 only");
    fr_release(c);
    fr_release(n);
    fr_release(r);
    /* the storage lives while a view does */
    fr_tensor *keep = fr_narrow(t, 0, 1, 1);
    fr_release(t);
    CHECK_CLOSE(fr_item(keep), 12.0, 0);
    fr_release(keep);
}

static void test_copy_into_strided(void) {
    fr_tensor *big = fr_zeros(FR_CPU, FR_F32, 4, FR_SHAPE(2, 4, 1, 2), FR_TAG_TRANSIENT);
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    fr_tensor *part = fr_from_host(FR_CPU, FR_F32, 4, FR_SHAPE(2, 2, 1, 2), FR_TAG_DATA, v);
    fr_tensor *slot = fr_narrow(big, 1, 2, 2);
    uint64_t before = big->storage->version;
    CHECK_OK(fr_copy_(slot, part));
    CHECK(big->storage->version == before + 1);
    float want[16] = {0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0, 5, 6, 7, 8};
    fr_t_allclose(big, want, 16, 0, 0, "copy into channel slice");
    fr_release(slot);
    fr_release(part);
    fr_release(big);
}

static void test_f16_bf16_rounding(void) {
    /* exact at representable values */
    const float exact[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f /* min normal */,
                           5.9604644775390625e-08f /* min subnormal */, 0.333251953125f};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        CHECK(fr_f16_to_f32(fr_f32_to_f16(exact[i])) == exact[i]);
    /* ties go to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 */
    CHECK(fr_f16_to_f32(fr_f32_to_f16(1.0f + 0x1p-11f)) == 1.0f);
    CHECK(fr_f16_to_f32(fr_f32_to_f16(1.0f + 3 * 0x1p-11f)) == 1.0f + 0x1p-9f);
    CHECK(fr_f16_to_f32(fr_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f)) == 1.0f + 0x1p-10f);
    /* overflow: 65520 is the first value that rounds to inf */
    CHECK(fr_f32_to_f16(65519.0f) == 0x7bff);
    CHECK(fr_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(fr_f32_to_f16(-1e30f) == 0xfc00);
    /* subnormal tie: 1.5 * 2^-24 rounds to 2 * 2^-24 (even) */
    CHECK(fr_f32_to_f16(1.5f * 0x1p-24f) == 0x0002);
    CHECK(fr_f32_to_f16(0.5f * 0x1p-24f) == 0x0000);
    float nan = 0.0f / 0.0f;
    float back = fr_f16_to_f32(fr_f32_to_f16(nan));
    CHECK(back != back);
    /* bf16: 8 mantissa bits, same exponent range as f32 */
    CHECK(fr_bf16_to_f32(fr_f32_to_bf16(3.0e38f)) == 3.00405527047391e+38f); /* PyTorch agrees */
    CHECK(fr_bf16_to_f32(fr_f32_to_bf16(1.0f + 0x1p-8f)) == 1.0f);
    CHECK(fr_bf16_to_f32(fr_f32_to_bf16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
    CHECK(fr_f32_to_bf16(1e-40f) == fr_f32_to_bf16(1e-40f)); /* subnormals pass through */
    back = fr_bf16_to_f32(fr_f32_to_bf16(nan));
    CHECK(back != back);
}

static void test_dtype_tensor_conversion(void) {
    float v[4] = {1.0f, 2.5f, -3.0f, 1.0f + 0x1p-11f};
    fr_tensor *t = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE(4), FR_TAG_DATA, v);
    fr_tensor *h = fr_to_dtype(t, FR_F16, FR_TAG_TRANSIENT);
    fr_tensor *back = h ? fr_to_dtype(h, FR_F32, FR_TAG_TRANSIENT) : NULL;
    float want[4] = {1.0f, 2.5f, -3.0f, 1.0f};
    fr_t_allclose(back, want, 4, 0, 0, "f32->f16->f32");
    CHECK(h && fr_nbytes(h) == 8);
    fr_tensor *i = fr_to_dtype(t, FR_I32, FR_TAG_TRANSIENT);
    CHECK(i && ((int32_t *)fr_data(i))[2] == -3);
    fr_release(i);
    fr_release(back);
    fr_release(h);
    fr_release(t);
}

static void test_bad_arguments(void) {
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(2, -1), FR_TAG_DATA)), FR_ERR_SHAPE,
              "negative size -1 in dimension 1");
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CPU, FR_F32, 6, FR_SHAPE(1, 1, 1, 1, 1, 1), FR_TAG_DATA)),
              FR_ERR_SHAPE, "6 dimensions");
    fr_tensor *a = fr_zeros(FR_CPU, FR_I32, 1, FR_SHAPE(3), FR_TAG_DATA);
    fr_tensor *b = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(4), FR_TAG_DATA);
    CHECK_ERR(fr_fill_(a, 1.0f), FR_ERR_DTYPE, "fill: input must be f32, f16 or bf16, got i32");
    CHECK_ERR(fr_copy_(b, a), FR_ERR_SHAPE, "differ in size");
    CHECK_ERR(fr_check_shape("conv2d", "weight", b, 2, FR_SHAPE(4, -1)), FR_ERR_SHAPE,
              "conv2d: weight has shape (4,), expected (4, *)");
    /* a NULL with that error pending is its result: status kept, the
     * first failure leads the message and the ops its NULL reached follow
     * in order (docs/ARCHITECTURE.md, "Errors") */
    const char *cause = "conv2d: weight has shape (4,), expected (4, *)";
    CHECK_ERR(fr_fill_(NULL, 1.0f), FR_ERR_SHAPE,
              "conv2d: weight has shape (4,), expected (4, *); then fill: input is NULL");
    CHECK_ERR(fr_t_status_of(fr_relu(NULL)), FR_ERR_SHAPE,
              "; then fill: input is NULL; then relu: x is NULL");
    CHECK(!strncmp(fr_last_error(), cause, strlen(cause))); /* the failing op first */
    const char *first = strstr(fr_last_error(), "is NULL");
    CHECK(first && strstr(first + 1, "is NULL") && !strstr(strstr(first + 1, "is NULL") + 1, "is NULL"));
    /* a long chain keeps its first four ops and the latest */
    for (int i = 0; i < 20; i++)
        fr_release(fr_relu(NULL));
    CHECK_ERR(fr_t_status_of(fr_scale(NULL, 2.0f)), FR_ERR_SHAPE,
              "; then fill: input is NULL; then relu: x is NULL; then relu: x is NULL; "
              "then relu: x is NULL; then ... (18 more); then scale: x is NULL");
    CHECK(!strncmp(fr_last_error(), cause, strlen(cause)));
    /* with none pending, the NULL itself is the error */
    fr_clear_error();
    CHECK_ERR(fr_fill_(NULL, 1.0f), FR_ERR_ARG, "fill: input is NULL");
    CHECK(!strstr(fr_last_error(), "then"));
    float host[3];
    CHECK_ERR(fr_read_f32(b, host, 3), FR_ERR_SHAPE, "buffer holds 3");
    fr_release(a);
    fr_release(b);
}

static void test_cuda_unavailable_is_an_error(void) {
    if (fr_t_have_cuda())
        SKIP("a GPU is present; covered by test_cuda");
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CUDA, FR_F32, 1, FR_SHAPE(4), FR_TAG_DATA)), FR_ERR_DEVICE,
              "cuda");
    fr_tensor *t = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(4), FR_TAG_DATA);
    CHECK_ERR(fr_t_status_of(fr_to_device(t, FR_CUDA, FR_TAG_DATA)), FR_ERR_DEVICE, "cuda");
    fr_release(t);
}

int main(void) {
    RUN(test_create_and_shape);
    RUN(test_from_host_and_item);
    RUN(test_views);
    RUN(test_copy_into_strided);
    RUN(test_f16_bf16_rounding);
    RUN(test_dtype_tensor_conversion);
    RUN(test_bad_arguments);
    RUN(test_cuda_unavailable_is_an_error);
    return TEST_SUMMARY();
}
