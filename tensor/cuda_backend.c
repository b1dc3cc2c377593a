/* cuda_backend.c: opens the CUDA backend (libfrugal_cuda.so) on first use,
 * fills the kernel table from it, and forwards the device API of
 * tensor/cuda.h to it; says why when it cannot (see tensor/cuda.h). */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cuda/fr_cuda.h"
#include "config.h"

/* ---- what is looked up ---- */

typedef struct {
    void *(*alloc)(size_t, size_t, size_t, size_t *);
    void (*free)(void *);
    void (*empty_cache)(void);
    void (*cache_stats)(size_t *, size_t *);
    fr_status (*memcpy)(void *, const void *, size_t, fr_copy_kind);
    fr_status (*memcpy_async)(void *, const void *, size_t, fr_copy_kind);
    fr_status (*synchronize)(void);
    void *(*host_alloc)(size_t);
    void (*host_free)(void *);
    fr_cuda_event *(*event_new)(void);
    fr_status (*event_record)(fr_cuda_event *);
    fr_status (*event_wait)(fr_cuda_event *);
    void (*event_free)(fr_cuda_event *);
    void (*set_cudnn)(bool);
    bool (*cudnn_enabled)(void);
    void (*set_workspace_budget)(size_t);
    size_t (*workspace_budget)(void);
    void (*conv_counts)(size_t *, size_t *);
    int (*probe)(char *, size_t);
    fr_status (*select_device)(int, int *);
} device_api;

/* The NCCL entry points: optional (a backend built without nccl.h lacks
 * them). */
typedef struct {
    fr_status (*unique_id)(unsigned char *);
    fr_status (*new_comm)(fr_cuda_nccl **, const unsigned char *, int, int);
    void (*free_comm)(fr_cuda_nccl *);
    fr_status (*sum_start)(fr_cuda_nccl *, void *, size_t, bool);
    fr_status (*broadcast_start)(fr_cuda_nccl *, void *const *, const size_t *, int, int);
    fr_status (*wait)(fr_cuda_nccl *);
} nccl_api;

static device_api api;
static nccl_api nccl;
static bool have_nccl;
static bool backend_loaded; /* opened and its entry points found (a GPU or not) */
static fr_cuda_kernel_table kernels;
const fr_cuda_kernel_table *fr_cuda_kernels;

typedef struct {
    const char *name;
    void *slot; /* a function pointer of api or kernels */
} symbol;

static const symbol symbols[] = {
    {"fr_cuda_alloc", &api.alloc},
    {"fr_cuda_free", &api.free},
    {"fr_cuda_empty_cache", &api.empty_cache},
    {"fr_cuda_cache_stats", &api.cache_stats},
    {"fr_cuda_memcpy", &api.memcpy},
    {"fr_cuda_memcpy_async", &api.memcpy_async},
    {"fr_cuda_synchronize", &api.synchronize},
    {"fr_cuda_host_alloc", &api.host_alloc},
    {"fr_cuda_host_free", &api.host_free},
    {"fr_cuda_event_new", &api.event_new},
    {"fr_cuda_event_record", &api.event_record},
    {"fr_cuda_event_wait", &api.event_wait},
    {"fr_cuda_event_free", &api.event_free},
    {"fr_cuda_set_cudnn", &api.set_cudnn},
    {"fr_cuda_cudnn_enabled", &api.cudnn_enabled},
    {"fr_cuda_set_workspace_budget", &api.set_workspace_budget},
    {"fr_cuda_workspace_budget", &api.workspace_budget},
    {"fr_cuda_conv_counts", &api.conv_counts},
    {"fr_cuda_backend_probe", &api.probe},
    {"fr_cuda_select_device", &api.select_device},
#define FR_KERNEL(name, params) {"fr_cuda_" #name, &kernels.name},
#include "kernels.def"
#undef FR_KERNEL
};
static const symbol nccl_symbols[] = {
    {"fr_cuda_nccl_unique_id", &nccl.unique_id},
    {"fr_cuda_nccl_new", &nccl.new_comm},
    {"fr_cuda_nccl_free", &nccl.free_comm},
    {"fr_cuda_nccl_sum_start", &nccl.sum_start},
    {"fr_cuda_nccl_broadcast_start", &nccl.broadcast_start},
    {"fr_cuda_nccl_wait", &nccl.wait},
};
FR_STATIC_ASSERT(sizeof nccl_symbols / sizeof *nccl_symbols == sizeof(nccl_api) / sizeof(void *),
                 "one NCCL symbol per slot");
FR_STATIC_ASSERT(sizeof(void (*)(void)) == sizeof(void *),
                 "dlsym hands out functions as object pointers");

/* Every kernel's name and parameter list: the backend holds the same string
 * from the kernels.def it was built with. */
#define FR_KERNEL(name, params) #name #params "\n"
static const char core_kernels[] =
#include "kernels.def"
    "";
#undef FR_KERNEL

/* ---- opening ---- */

static pthread_once_t open_once = PTHREAD_ONCE_INIT;
static int device_count;
static char reason[1536];

/* The directory of the object that holds this code (libfrugal.so, or the
 * program linked with libfrugal.a), and of the running program. */
static void candidate_dirs(char dirs[2][PATH_MAX]) {
    dirs[0][0] = dirs[1][0] = '\0';
    Dl_info info;
    if (dladdr((void *)&fr_cuda_device_count, &info) && info.dli_fname && strchr(info.dli_fname, '/'))
        snprintf(dirs[0], PATH_MAX, "%s", info.dli_fname);
    ssize_t n = readlink("/proc/self/exe", dirs[1], PATH_MAX - 1);
    dirs[1][n > 0 ? n : 0] = '\0';
    for (int i = 0; i < 2; i++) {
        char *slash = strrchr(dirs[i], '/');
        if (slash)
            *slash = '\0';
        else
            dirs[i][0] = '\0';
    }
}

/* dlopen()s the backend from the places tensor/cuda.h lists; NULL with what
 * each try said in `why`. */
static void *open_backend(char *why, size_t len) {
    const char *file = FR_CONFIG_CUDA_BACKEND;
    size_t used = 0;
    why[0] = '\0';
    const char *env = getenv("FR_CUDA_BACKEND");
    if (env && *env) {
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h)
            snprintf(why, len, "FR_CUDA_BACKEND=%s: %s", env, dlerror());
        return h;
    }
    char dirs[2][PATH_MAX];
    candidate_dirs(dirs);
    static const char *const below[] = {"", "/..", "/../lib"};
    for (int d = 0; d < 2; d++)
        for (size_t b = 0; b < sizeof below / sizeof *below; b++) {
            if (!dirs[d][0])
                continue;
            char path[PATH_MAX + 64];
            int n = snprintf(path, sizeof path, "%s%s/%s", dirs[d], below[b], file);
            if (n < 0 || (size_t)n >= sizeof path || access(path, F_OK) != 0)
                continue;
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h)
                return h;
            /* the file is there but does not load: that is the reason to give */
            snprintf(why, len, "%s", dlerror());
            return NULL;
        }
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (h)
        return h;
    used = (size_t)snprintf(why, len, "no %s found (looked beside", file);
    for (int d = 0; d < 2 && used < len; d++)
        if (dirs[d][0])
            used += (size_t)snprintf(why + used, len - used, " %s,", dirs[d]);
    if (used < len)
        snprintf(why + used, len - used, " in ../ and ../lib from there, and on the loader's path; "
                 "set FR_CUDA_BACKEND=PATH)");
    return NULL;
}

static bool find_symbols(void *h, char *why, size_t len) {
    const int *abi = dlsym(h, "fr_cuda_backend_abi");
    const char *sig = dlsym(h, "fr_cuda_backend_kernels");
    if (!abi || *abi != FR_CUDA_BACKEND_ABI || !sig || strcmp(sig, core_kernels) != 0) {
        snprintf(why, len, "the CUDA backend was built from another version of frugal (entry points "
                 "or kernels.def differ): rebuild it with this one");
        return false;
    }
    for (size_t i = 0; i < sizeof symbols / sizeof *symbols; i++) {
        void *f = dlsym(h, symbols[i].name);
        if (!f) {
            snprintf(why, len, "the CUDA backend lacks %s", symbols[i].name);
            return false;
        }
        memcpy(symbols[i].slot, &f, sizeof f);
    }
    /* All of NCCL's or none: a backend built without nccl.h has none. */
    size_t found = 0, n_nccl = sizeof nccl_symbols / sizeof *nccl_symbols;
    for (size_t i = 0; i < n_nccl; i++) {
        void *f = dlsym(h, nccl_symbols[i].name);
        found += f != NULL;
        memcpy(nccl_symbols[i].slot, &f, sizeof f);
    }
    if (found != 0 && found != n_nccl) {
        snprintf(why, len, "the CUDA backend has only %zu of the %zu NCCL entry points: rebuild it", found,
                 n_nccl);
        return false;
    }
    have_nccl = found == n_nccl;
    return true;
}

static void open_cuda(void) {
    const char *off = getenv("FR_CUDA");
    if (off && !strcmp(off, "0")) {
        snprintf(reason, sizeof reason, "CUDA is switched off (FR_CUDA=0 in the environment)");
        return;
    }
    char why[1024];
    void *h = open_backend(why, sizeof why);
    if (!h) {
        snprintf(reason, sizeof reason, "%sthe CUDA backend could not be loaded: %s",
                 FR_CONFIG_CUDA ? "" : "this frugal was built without CUDA (CUDA=0 or no nvcc), and ",
                 why);
        return;
    }
    if (!find_symbols(h, why, sizeof why)) {
        snprintf(reason, sizeof reason, "%s", why);
        memset(&api, 0, sizeof api);
        memset(&nccl, 0, sizeof nccl);
        memset(&kernels, 0, sizeof kernels);
        return; /* the handle stays open: CUDA libraries do not like being unloaded */
    }
    backend_loaded = true;
    /* The runtime reports a missing driver as "insufficient driver"; naming
     * libcuda says what to install. */
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver) {
        snprintf(reason, sizeof reason, "no NVIDIA driver: %s", dlerror());
        return;
    }
    int n = api.probe(why, sizeof why);
    if (n <= 0) {
        snprintf(reason, sizeof reason, "no usable CUDA device: %s", why);
        return;
    }
    device_count = n;
    fr_cuda_kernels = &kernels;
}

int fr_cuda_device_count(void) {
    pthread_once(&open_once, open_cuda);
    return device_count;
}

const char *fr_cuda_unavailable_reason(void) {
    pthread_once(&open_once, open_cuda);
    return device_count > 0 ? "" : reason;
}

fr_status fr_no_cuda(const char *what) {
    return fr_error(FR_ERR_DEVICE, "%s: no CUDA: %s", what, fr_cuda_unavailable_reason());
}

/* ---- the device API, forwarded ---- */

/* Whether a GPU is usable; every forwarder checks, so none runs on a backend
 * that is half there. */
static bool usable(void) { return fr_cuda_device_count() > 0; }

void *fr_cuda_alloc(size_t nbytes, size_t peak, size_t limit, size_t *block_bytes) {
    if (!usable()) {
        fr_no_cuda("cuda alloc");
        return NULL;
    }
    return api.alloc(nbytes, peak, limit, block_bytes);
}
void fr_cuda_free(void *ptr) {
    if (ptr && usable())
        api.free(ptr);
}
void fr_cuda_empty_cache(void) {
    if (usable())
        api.empty_cache();
}
void fr_cuda_cache_stats(size_t *reserved, size_t *device_mallocs) {
    *reserved = *device_mallocs = 0;
    if (usable())
        api.cache_stats(reserved, device_mallocs);
}
fr_status fr_cuda_memcpy(void *dst, const void *src, size_t nbytes, fr_copy_kind kind) {
    return usable() ? api.memcpy(dst, src, nbytes, kind) : fr_no_cuda("cuda memcpy");
}
fr_status fr_cuda_memcpy_async(void *dst, const void *src, size_t nbytes, fr_copy_kind kind) {
    return usable() ? api.memcpy_async(dst, src, nbytes, kind) : fr_no_cuda("cuda memcpy async");
}
fr_status fr_cuda_synchronize(void) { return usable() ? api.synchronize() : FR_OK; }
void *fr_cuda_host_alloc(size_t nbytes) {
    if (!usable()) {
        fr_no_cuda("cuda host alloc");
        return NULL;
    }
    return api.host_alloc(nbytes);
}
void fr_cuda_host_free(void *ptr) {
    if (ptr && usable())
        api.host_free(ptr);
}
fr_cuda_event *fr_cuda_event_new(void) {
    if (!usable()) {
        fr_no_cuda("cuda event");
        return NULL;
    }
    return api.event_new();
}
fr_status fr_cuda_event_record(fr_cuda_event *e) {
    return usable() ? api.event_record(e) : fr_no_cuda("cuda event record");
}
fr_status fr_cuda_event_wait(fr_cuda_event *e) { return usable() ? api.event_wait(e) : FR_OK; }
void fr_cuda_event_free(fr_cuda_event *e) {
    if (e && usable())
        api.event_free(e);
}
void fr_cuda_set_cudnn(bool enabled) {
    if (usable())
        api.set_cudnn(enabled);
}
bool fr_cuda_cudnn_enabled(void) { return usable() && api.cudnn_enabled(); }
void fr_cuda_set_workspace_budget(size_t bytes) {
    if (usable())
        api.set_workspace_budget(bytes);
}
size_t fr_cuda_workspace_budget(void) { return usable() ? api.workspace_budget() : 0; }
void fr_cuda_conv_counts(size_t *cudnn_calls, size_t *im2col_calls) {
    *cudnn_calls = *im2col_calls = 0;
    if (usable())
        api.conv_counts(cudnn_calls, im2col_calls);
}

fr_status fr_cuda_select_device(int local_rank, int *chosen) {
    *chosen = 0;
    return usable() ? api.select_device(local_rank, chosen) : fr_no_cuda("cuda select device");
}

/* ---- NCCL, forwarded (cuda/fr_cuda.h) ---- */

bool fr_cuda_backend_has_nccl(void) {
    pthread_once(&open_once, open_cuda);
    return have_nccl;
}

fr_status fr_cuda_nccl_ready(const char *what) {
    pthread_once(&open_once, open_cuda);
    if (!backend_loaded)
        return fr_error(FR_ERR_DEVICE, "%s: NCCL is part of the CUDA backend, which is not available: %s",
                        what, fr_cuda_unavailable_reason());
    if (!have_nccl)
        return fr_error(FR_ERR_DEVICE, "%s: the CUDA backend was built without NCCL (no nccl.h in the CUDA "
                        "toolkit at build time), so CUDA models cannot train data-parallel; rebuild with a "
                        "toolkit that has NCCL (the Makefile looks for $CUDA_HOME/include/nccl.h)", what);
    return usable() ? FR_OK : fr_no_cuda(what);
}

fr_status fr_cuda_nccl_unique_id(unsigned char id[FR_CUDA_NCCL_ID_BYTES]) {
    FR_TRY(fr_cuda_nccl_ready("nccl unique id"));
    return nccl.unique_id(id);
}
fr_status fr_cuda_nccl_new(fr_cuda_nccl **out, const unsigned char id[FR_CUDA_NCCL_ID_BYTES], int rank,
                           int world) {
    *out = NULL;
    FR_TRY(fr_cuda_nccl_ready("nccl communicator"));
    return nccl.new_comm(out, id, rank, world);
}
void fr_cuda_nccl_free(fr_cuda_nccl *n) {
    if (n && have_nccl)
        nccl.free_comm(n);
}
fr_status fr_cuda_nccl_sum_start(fr_cuda_nccl *n, void *buf, size_t count, bool f64) {
    FR_TRY(fr_cuda_nccl_ready("nccl all-reduce"));
    return nccl.sum_start(n, buf, count, f64);
}
fr_status fr_cuda_nccl_broadcast_start(fr_cuda_nccl *n, void *const *bufs, const size_t *bytes, int count,
                                       int root) {
    FR_TRY(fr_cuda_nccl_ready("nccl broadcast"));
    return nccl.broadcast_start(n, bufs, bytes, count, root);
}
fr_status fr_cuda_nccl_wait(fr_cuda_nccl *n) {
    FR_TRY(fr_cuda_nccl_ready("nccl wait"));
    return nccl.wait(n);
}
