/* registry.c: models by name; see registry.h. */
#include "registry.h"

#include <stdio.h>
#include <string.h>

#include "densenet.h"
#include "resnet.h"

enum { MAX_ENTRIES = 64 };

typedef struct {
    const char *name, *usage;
    bool family;
    fr_model_ctor create;
} entry;

/* One table per process, filled with the built-ins on first use. Not
 * thread-safe: register models before starting threads. */
static entry table[MAX_ENTRIES];
static int count;
static bool builtins_done;

static fr_model *densenet_ctor(const char *name, int in_channels, int num_classes, uint64_t seed) {
    return fr_densenet_create(name, 0, in_channels, num_classes, seed);
}

static fr_status add(const char *name, bool family, fr_model_ctor create, const char *usage) {
    if (!name || !*name || !create)
        return fr_error(FR_ERR_ARG, "model registry: a model needs a name and a constructor");
    for (int i = 0; i < count; i++)
        if (!strcmp(table[i].name, name))
            return fr_error(FR_ERR_ARG, "model registry: \"%s\" is registered already", name);
    if (count == MAX_ENTRIES)
        return fr_error(FR_ERR_OOM, "model registry: full (%d models)", MAX_ENTRIES);
    table[count++] = (entry){.name = name, .usage = usage ? usage : name, .family = family,
                             .create = create};
    return FR_OK;
}

/* The built-ins go through the same call as any user model. */
static void register_builtins(void) {
    if (builtins_done)
        return;
    builtins_done = true;
    add("resnet", true, fr_resnet_create, "resnet<6n+2> (resnet20, resnet56, resnet110)");
    add("preresnet", true, fr_resnet_create, "preresnet<9n+2> (preresnet164)");
    add("densenet", true, densenet_ctor, "densenet-bc-<L>[-k<K>] (densenet-bc-100)");
}

fr_status fr_model_register(const char *name, bool family, fr_model_ctor create, const char *usage) {
    register_builtins();
    return add(name, family, create, usage);
}

fr_model *fr_model_create(const char *name, int in_channels, int num_classes, uint64_t seed) {
    register_builtins();
    for (int i = 0; name && i < count; i++)
        if (!table[i].family && !strcmp(table[i].name, name))
            return table[i].create(name, in_channels, num_classes, seed);
    for (int i = 0; name && i < count; i++)
        if (table[i].family && !strncmp(table[i].name, name, strlen(table[i].name)))
            return table[i].create(name, in_channels, num_classes, seed);
    char list[1024] = "";
    size_t used = 0;
    for (int i = 0; i < count; i++)
        used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0, "%s%s",
                                 i ? ", " : "", table[i].usage);
    fr_error(FR_ERR_ARG, "unknown model \"%s\" (registered: %s)", name ? name : "", list);
    return NULL;
}

fr_status fr_model_check_size(const char *name, double params, double activation_bytes) {
    if (!(params <= (double)FR_MODEL_MAX_PARAMS))
        return fr_error(FR_ERR_ARG, "model %s: %.4g parameters, over the ceiling of %lld "
                        "(FR_MODEL_MAX_PARAMS); nothing was allocated", name, params,
                        (long long)FR_MODEL_MAX_PARAMS);
    if (!(activation_bytes <= (double)FR_MODEL_MAX_ACTIVATION_BYTES))
        return fr_error(FR_ERR_ARG, "model %s: %.4g activation bytes per 32x32 image, over the ceiling "
                        "of %lld (4 GiB, FR_MODEL_MAX_ACTIVATION_BYTES); nothing was allocated", name,
                        activation_bytes, (long long)FR_MODEL_MAX_ACTIVATION_BYTES);
    return FR_OK;
}

int fr_model_registry_count(void) {
    register_builtins();
    return count;
}

const char *fr_model_registry_usage(int i) {
    register_builtins();
    return i >= 0 && i < count ? table[i].usage : NULL;
}
