/* concat.cu: the channel copy behind concat and its backward. For every
 * sample i, channels [src_c0, src_c0 + count) of src land on channels
 * [dst_c0, dst_c0 + count) of dst; within one sample they are one contiguous
 * run of count * HW elements on both sides. So the whole copy is a 2-d copy of
 * n rows of that width, with each side's per-sample pitch: one call, ordered
 * on the stream like a kernel. */
#include "internal.h"

extern "C" fr_status fr_cuda_copy_channels(void *dst, int dst_c, int dst_c0, const void *src,
                                           int src_c, int src_c0, int count, int n, int hw,
                                           size_t elem_size) {
    size_t width = (size_t)count * (size_t)hw * elem_size;
    if (width == 0 || n <= 0)
        return FR_OK;
    size_t dpitch = (size_t)dst_c * (size_t)hw * elem_size;
    size_t spitch = (size_t)src_c * (size_t)hw * elem_size;
    char *d = (char *)dst + (size_t)dst_c0 * (size_t)hw * elem_size;
    const char *s = (const char *)src + (size_t)src_c0 * (size_t)hw * elem_size;
    FR_CUDA_CHECK(cudaMemcpy2DAsync(d, dpitch, s, spitch, width, (size_t)n,
                                    cudaMemcpyDeviceToDevice, 0));
    return FR_OK;
}
