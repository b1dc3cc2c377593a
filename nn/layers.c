/* layers.c: Conv2d, ConvTranspose2d, BatchNorm2d and Linear over a parameter registry; see
 * layers.h. */
#include "layers.h"

#include "../autograd/node.h"

#include <math.h>

/* Registers "<name>.<field>" and returns the tensor, or NULL. */
static fr_tensor *new_tensor(fr_params *params, const char *name, const char *field, fr_param_kind kind,
                             fr_dtype dtype, int ndim, const int64_t *shape) {
    char full[FR_NAME_MAX];
    return fr_params_new_tensor(params, fr_name_join(full, sizeof full, name, field), kind, dtype, ndim,
                                shape);
}

static fr_status check_sizes(const char *op, const char *name, int a, int b) {
    if (a <= 0 || b <= 0)
        return fr_error(FR_ERR_ARG, "%s %s: sizes must be positive, got %d and %d", op, name, a, b);
    return FR_OK;
}

fr_status fr_conv2d_layer_init(fr_conv2d_layer *l, fr_params *params, const char *name, int in_channels,
                               int out_channels, int kernel, int stride, int pad, bool bias, fr_rng *rng) {
    FR_TRY(check_sizes("conv2d", name, in_channels, out_channels));
    FR_TRY(check_sizes("conv2d", name, kernel, stride));
    if (pad < 0)
        return fr_error(FR_ERR_ARG, "conv2d %s: negative padding %d", name, pad);
    *l = (fr_conv2d_layer){.p = {.stride = stride, .pad = pad}};
    l->weight = new_tensor(params, name, "weight", FR_PARAMETER, FR_F32, 4,
                           FR_SHAPE(out_channels, in_channels, kernel, kernel));
    if (!l->weight)
        return fr_last_status();
    double fan_out = (double)out_channels * kernel * kernel;
    FR_TRY(fr_init_normal_(l->weight, 0.0, sqrt(2.0 / fan_out), rng));
    if (bias) {
        l->bias = new_tensor(params, name, "bias", FR_PARAMETER, FR_F32, 1, FR_SHAPE(out_channels));
        if (!l->bias)
            return fr_last_status();
        double bound = 1.0 / sqrt((double)in_channels * kernel * kernel);
        FR_TRY(fr_init_uniform_(l->bias, -bound, bound, rng));
    }
    return FR_OK;
}

fr_tensor *fr_conv2d_layer_forward(const fr_conv2d_layer *l, fr_tensor *x) {
    if (!l || !x) {
        fr_error_null("conv2d layer", !l ? "layer" : "x");
        return NULL;
    }
    return fr_conv2d(x, l->weight, l->bias, l->p);
}

fr_status fr_conv_transpose2d_layer_init(fr_conv_transpose2d_layer *l, fr_params *params,
                                         const char *name, int in_channels, int out_channels,
                                         int kernel, fr_conv_transpose_params p, bool bias,
                                         fr_rng *rng) {
    const char *op = "conv_transpose2d";
    FR_TRY(check_sizes(op, name, in_channels, out_channels));
    FR_TRY(check_sizes(op, name, kernel, p.stride));
    int g = p.groups ? p.groups : 1;
    if (g < 1 || in_channels % g || out_channels % g)
        return fr_error(FR_ERR_ARG, "%s %s: groups %d must divide the %d input and %d output "
                        "channels", op, name, g, in_channels, out_channels);
    *l = (fr_conv_transpose2d_layer){.p = p};
    l->weight = new_tensor(params, name, "weight", FR_PARAMETER, FR_F32, 4,
                           FR_SHAPE(in_channels, out_channels / g, kernel, kernel));
    if (!l->weight)
        return fr_last_status();
    double bound = 1.0 / sqrt((double)(out_channels / g) * kernel * kernel);
    FR_TRY(fr_init_uniform_(l->weight, -bound, bound, rng));
    if (bias) {
        l->bias = new_tensor(params, name, "bias", FR_PARAMETER, FR_F32, 1, FR_SHAPE(out_channels));
        if (!l->bias)
            return fr_last_status();
        FR_TRY(fr_init_uniform_(l->bias, -bound, bound, rng));
    }
    return FR_OK;
}

fr_tensor *fr_conv_transpose2d_layer_forward(const fr_conv_transpose2d_layer *l, fr_tensor *x) {
    if (!l || !x) {
        fr_error_null("conv_transpose2d layer", !l ? "layer" : "x");
        return NULL;
    }
    return fr_conv_transpose2d(x, l->weight, l->bias, l->p);
}

fr_status fr_batch_norm2d_layer_init(fr_batch_norm2d_layer *l, fr_params *params, const char *name,
                                    int channels) {
    FR_TRY(check_sizes("batchnorm2d", name, channels, 1));
    *l = (fr_batch_norm2d_layer){.momentum = 0.1f, .eps = 1e-5f};
    const int64_t *c = FR_SHAPE(channels);
    if (!(l->weight = new_tensor(params, name, "weight", FR_PARAMETER, FR_F32, 1, c)) ||
        !(l->bias = new_tensor(params, name, "bias", FR_PARAMETER, FR_F32, 1, c)) ||
        !(l->running_mean = new_tensor(params, name, "running_mean", FR_BUFFER, FR_F32, 1, c)) ||
        !(l->running_var = new_tensor(params, name, "running_var", FR_BUFFER, FR_F32, 1, c)) ||
        !(l->num_batches_tracked = new_tensor(params, name, "num_batches_tracked", FR_BUFFER, FR_I32, 0, c)))
        return fr_last_status();
    FR_TRY(fr_fill_(l->weight, 1.0f));
    return fr_fill_(l->running_var, 1.0f);
}

fr_status fr_group_norm_layer_init(fr_group_norm_layer *l, fr_params *params, const char *name,
                                   int channels, int groups) {
    FR_TRY(check_sizes("groupnorm", name, channels, 1));
    if (groups < 1 || channels % groups != 0)
        return fr_error(FR_ERR_ARG, "groupnorm %s: groups %d does not divide its %d channels", name,
                        groups, channels);
    *l = (fr_group_norm_layer){.groups = groups, .eps = 1e-5f};
    const int64_t *c = FR_SHAPE(channels);
    if (!(l->weight = new_tensor(params, name, "weight", FR_PARAMETER, FR_F32, 1, c)) ||
        !(l->bias = new_tensor(params, name, "bias", FR_PARAMETER, FR_F32, 1, c)))
        return fr_last_status();
    return fr_fill_(l->weight, 1.0f);
}

void fr_batch_norm2d_layer_count_batch(const fr_batch_norm2d_layer *l) {
    /* PyTorch counts batches seen in training; the counter is host memory
     * (params.h), so this costs no device round trip. A checkpointed segment
     * replayed in backward is not a new batch. */
    if (fr_in_recompute())
        return;
    int32_t *count = fr_data(l->num_batches_tracked);
    (*count)++;
    fr_bump_version(l->num_batches_tracked, "batchnorm");
}

fr_bn_state fr_batch_norm2d_layer_state(const fr_batch_norm2d_layer *l, bool training) {
    return (fr_bn_state){.gamma = l->weight, .beta = l->bias, .running_mean = l->running_mean,
                         .running_var = l->running_var, .momentum = l->momentum, .eps = l->eps,
                         .training = training};
}

fr_tensor *fr_batch_norm2d_layer_forward(const fr_batch_norm2d_layer *l, fr_tensor *x, bool training) {
    if (!l || !x) {
        fr_error_null("batch_norm layer", !l ? "layer" : "x");
        return NULL;
    }
    fr_tensor *y = fr_batch_norm(x, l->weight, l->bias, l->running_mean, l->running_var, training,
                                 l->momentum, l->eps);
    if (y && training)
        fr_batch_norm2d_layer_count_batch(l);
    return y;
}

fr_status fr_linear_layer_init(fr_linear_layer *l, fr_params *params, const char *name, int in_features,
                               int out_features, bool bias, fr_rng *rng) {
    FR_TRY(check_sizes("linear", name, in_features, out_features));
    *l = (fr_linear_layer){0};
    l->weight = new_tensor(params, name, "weight", FR_PARAMETER, FR_F32, 2,
                           FR_SHAPE(out_features, in_features));
    if (!l->weight)
        return fr_last_status();
    /* PyTorch's default: kaiming_uniform(a = sqrt(5)) gives the same bound as
     * the bias, 1 / sqrt(fan_in). */
    double bound = 1.0 / sqrt((double)in_features);
    FR_TRY(fr_init_uniform_(l->weight, -bound, bound, rng));
    if (bias) {
        l->bias = new_tensor(params, name, "bias", FR_PARAMETER, FR_F32, 1, FR_SHAPE(out_features));
        if (!l->bias)
            return fr_last_status();
        FR_TRY(fr_init_uniform_(l->bias, -bound, bound, rng));
    }
    return FR_OK;
}

fr_tensor *fr_linear_layer_forward(const fr_linear_layer *l, fr_tensor *x) {
    if (!l || !x) {
        fr_error_null("linear layer", !l ? "layer" : "x");
        return NULL;
    }
    return fr_linear(x, l->weight, l->bias);
}
