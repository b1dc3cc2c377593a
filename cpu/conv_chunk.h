/* cpu/conv_chunk.h: a convolution's data passes in chunks of images, so
 * that the workspace a pass takes stays under a cap however large the batch
 * (cpu/conv_chunk.c). Internal: not part of frugal.h. */
#ifndef FR_CPU_CONV_CHUNK_H
#define FR_CPU_CONV_CHUNK_H

#include <stddef.h>

#include "../tensor/kernels.h"

/* The default cap on one forward or backward (data) pass's workspace:
 * 16 MiB, twice what any ResNet-56 layer takes at batch 64 (8 MiB: oneDNN's
 * reordered x and y), so plain b64 is not chunked (docs/ARCHITECTURE.md,
 * "Workspace cap"). */
#define FR_CONV_WORKSPACE_CAP_DEFAULT ((size_t)16 << 20)

/* Sets the cap (process-wide; not while convs run on other threads); 0
 * removes it (every pass on the whole batch). */
void fr_cpu_conv_set_workspace_cap(size_t bytes);
size_t fr_cpu_conv_workspace_cap(void);

/* One pass (dir 0 forward: out y, in0 x; 1 backward (data): out dx, in0 dy;
 * in1 the weight) of s on the given buffers, and the workspace bytes that
 * pass takes for s. */
typedef fr_status (*fr_conv_pass_fn)(const fr_conv_shape *s, int dir, void *out, const void *in0,
                                     const void *in1);
typedef fr_status (*fr_conv_ws_fn)(const fr_conv_shape *s, int dir, size_t *bytes);

/* Runs pass on the whole batch when ws says it fits the cap, else on
 * consecutive chunks of nearly equal size, none above the most images
 * whose workspace fits (at least one image), elem bytes per element. Each image's result is the same bits
 * either way: the data passes' results do not depend on the batch an image
 * is in (tests/test_cpu_backends.c). */
fr_status fr_cpu_conv_in_chunks(const fr_conv_shape *s, int dir, size_t elem, void *out,
                                const void *in0, const void *in1, fr_conv_ws_fn ws,
                                fr_conv_pass_fn pass);

#endif
