/* flat_vgg.h: the flat chain of layers the budget tests plan (issue 22): four
 * conv + norm + ReLU layers on the root, a max pool after the second, global
 * pool and linear, the way docs/MODELS.md section 1 writes a model. Shared by
 * test_budget_run.c and test_planner_flat.c. */
#ifndef FR_TEST_FLAT_VGG_H
#define FR_TEST_FLAT_VGG_H

#include <stdio.h>

#include "nn/build.h"

static inline fr_model *flat_vgg(void) {
    fr_model *m = fr_model_new("flatvgg", 3, 10, 3);
    fr_module *net = fr_model_root(m);
    static const int ch[][2] = {{3, 16}, {16, 16}, {16, 32}, {32, 32}};
    for (int i = 0; i < 4; i++) {
        char conv[16], bn[16];
        snprintf(conv, sizeof conv, "c%d_conv", i + 1);
        snprintf(bn, sizeof bn, "c%d_bn", i + 1);
        fr_conv2d_new(net, conv, (fr_conv2d_opts){.in = ch[i][0], .out = ch[i][1]});
        fr_norm_new(net, bn, (fr_norm_opts){.channels = ch[i][1], .act = FR_ACT_RELU});
        if (i == 1)
            fr_max_pool2d_new(net, "p1", (fr_pool_params){.kernel = 2, .stride = 2});
    }
    fr_global_avg_pool_new(net, "gap");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 32, .out = 10});
    return fr_model_finish(m);
}

#endif
