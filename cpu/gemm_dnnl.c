/* cpu/gemm_dnnl.c: the kernel table's CPU GEMM (fr_cpu_gemm), which linear
 * layers run. With oneDNN it is a matmul primitive on the row-major buffers
 * as they are (a transposed operand is a stride, so nothing is copied),
 * alpha as an output scale and beta as a sum post-op; one plan per (m, n, k,
 * transposes, alpha, beta, threads), kept (fr_dnnl.h). Without oneDNN, or
 * for an empty product, the reference GEMM runs (cpu/gemm.c). */
#include <string.h>

#include "../tensor/kernels.h"
#include "fr_dnnl.h"

#ifdef FR_HAVE_DNNL

typedef struct {
    int m, n, k, trans_a, trans_b, threads;
    float alpha, beta;
} gemm_key;

static void matrix_md(dnnl_memory_desc_t *md, int rows, int cols, bool trans) {
    /* (rows, cols) of op(X); X itself is stored (cols, rows) when trans */
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : cols, trans ? rows : 1};
    dnnl_status_t st = dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_f32, strides);
    FR_ASSERT(st == dnnl_success);
}

static fr_status build_gemm(fr_dnnl_plan *plan, const void *key_) {
    const gemm_key *key = key_;
    dnnl_memory_desc_t a_md, b_md, c_md;
    matrix_md(&a_md, key->m, key->k, key->trans_a);
    matrix_md(&b_md, key->k, key->n, key->trans_b);
    matrix_md(&c_md, key->m, key->n, false);
    dnnl_matmul_desc_t d;
    dnnl_status_t st = dnnl_matmul_desc_init(&d, &a_md, &b_md, NULL, &c_md);
    if (st != dnnl_success)
        return fr_dnnl_error(st, "describing a matmul");
    dnnl_primitive_attr_t attr = fr_dnnl_attr_new();
    if (!attr)
        return fr_last_status();
    dnnl_post_ops_t ops = NULL;
    if (key->alpha != 1.0f)
        st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &key->alpha);
    if (st == dnnl_success && key->beta != 0.0f) {
        st = dnnl_post_ops_create(&ops);
        if (st == dnnl_success)
            st = dnnl_post_ops_append_sum(ops, key->beta);
        if (st == dnnl_success)
            st = dnnl_primitive_attr_set_post_ops(attr, ops);
        dnnl_post_ops_destroy(ops);
    }
    dnnl_primitive_desc_t pd = NULL;
    if (st == dnnl_success)
        st = dnnl_primitive_desc_create(&pd, &d, attr, fr_dnnl_engine(), NULL);
    dnnl_primitive_attr_destroy(attr);
    return fr_dnnl_plan_init(plan, st, pd, 3,
                             (int[]){DNNL_ARG_DST, DNNL_ARG_SRC, DNNL_ARG_WEIGHTS},
                             (dnnl_memory_desc_t[]){c_md, a_md, b_md}, (bool[]){true, false, false});
}

fr_status fr_cpu_gemm(float *c, const float *a, const float *b, int m, int n, int k, bool trans_a,
                      bool trans_b, float alpha, float beta) {
    if (m <= 0 || n <= 0 || k <= 0)
        return fr_cpu_gemm_reference(c, a, b, m, n, k, trans_a, trans_b, alpha, beta);
    gemm_key key;
    memset(&key, 0, sizeof key);
    key = (gemm_key){m, n, k, trans_a, trans_b, fr_dnnl_threads(), alpha, beta};
    const fr_dnnl_plan *p = fr_dnnl_cached_plan(&key, sizeof key, build_gemm);
    if (!p)
        return fr_last_status();
    if (!p->prim)
        return fr_cpu_gemm_reference(c, a, b, m, n, k, trans_a, trans_b, alpha, beta);
    return fr_dnnl_plan_run(p, (void *[]){c, (void *)a, (void *)b}, "gemm (matmul)");
}

#else

fr_status fr_cpu_gemm(float *c, const float *a, const float *b, int m, int n, int k, bool trans_a,
                      bool trans_b, float alpha, float beta) {
    return fr_cpu_gemm_reference(c, a, b, m, n, k, trans_a, trans_b, alpha, beta);
}
#endif
