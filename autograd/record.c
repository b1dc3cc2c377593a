/* record.c: the recording step shared by the one-input, one-output ops
 * (autograd.h: fr_record_unary). */
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "node.h"

fr_status fr_record_unary(const char *op, fr_backward_fn backward, fr_tensor *x, fr_tensor *y,
                          const void *ctx, size_t ctx_size, fr_tensor *save) {
    if (!fr_should_record(1, &x))
        return FR_OK;
    void *c = NULL;
    if (ctx_size && !(c = malloc(ctx_size)))
        return fr_error(FR_ERR_OOM, "%s: out of memory", op);
    if (c)
        memcpy(c, ctx, ctx_size);
    fr_node *node = fr_node_new(op, backward, 1, &x, 1);
    if (!node) {
        free(c);
        return fr_last_status();
    }
    if (c)
        fr_node_set_ctx(node, c, NULL);
    if (save && fr_node_save(node, save) < 0)
        return fr_last_status(); /* the node stays on the tape; nothing refers to it */
    fr_node_set_output(node, 0, y);
    return FR_OK;
}
