/* registry.h: models by name. The built-in models are registered the same
 * way a user's model is, and every program that takes --model (train,
 * validate, memreport) creates its model here, so a model registered by a
 * program that links the library runs under the library's loop the same
 * way the built-ins do.
 *
 *     static fr_model *tiny_create(const char *name, int in, int classes, uint64_t seed);
 *     fr_model_register("tiny", false, tiny_create, "tiny (a 3-layer CNN)");
 *     fr_model *m = fr_model_create("tiny", 1, 10, 42);
 *
 * A family entry (family = true) takes every name that starts with its
 * own: "resnet" builds "resnet20", "resnet56", ... and its constructor
 * parses the rest. */
#ifndef FR_REGISTRY_H
#define FR_REGISTRY_H

#include "../nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds the model `name` (the full requested name) or returns NULL with an
 * error. */
typedef fr_model *(*fr_model_ctor)(const char *name, int in_channels, int num_classes, uint64_t seed);

/* Adds a model (or a family); `usage` is shown in the unknown-model error.
 * The strings must outlive the registry (string literals). FR_ERR_ARG for
 * an empty or taken name, FR_ERR_OOM past 64 entries. */
fr_status fr_model_register(const char *name, bool family, fr_model_ctor create, const char *usage);
/* The model registered under `name` (exact names first, then families),
 * on the CPU with the plain strategy; NULL with FR_ERR_ARG listing every
 * registered usage when nothing matches. */
fr_model *fr_model_create(const char *name, int in_channels, int num_classes, uint64_t seed);
/* The size ceilings every built-in model name is checked against before
 * anything is allocated (models/resnet.c, models/densenet.c compute both from the
 * name's numbers, the input channels and the class count alone): the
 * parameters (weights and biases, 2^28: 1 GiB in f32) and the activation
 * bytes of one 32x32 image, f32, every layer's output counted once (4 GiB):
 * what a name could ask for past these is a typo or an attack, not a model
 * this library trains. */
#define FR_MODEL_MAX_PARAMS ((int64_t)1 << 28)
#define FR_MODEL_MAX_ACTIVATION_BYTES ((int64_t)1 << 32)
/* FR_OK when both estimates are within the ceilings; else FR_ERR_ARG naming
 * the model, the estimate and the ceiling. Counts as doubles: a name's
 * numbers multiplied out may pass 2^63. */
fr_status fr_model_check_size(const char *name, double params, double activation_bytes);
/* The registered entries, built-ins first: how many, and the usage of i. */
int fr_model_registry_count(void);
const char *fr_model_registry_usage(int i);

#ifdef __cplusplus
}
#endif
#endif
