/* test_nccl.c: NCCL inside the CUDA backend (cuda/nccl.cu, cuda/fr_cuda.h),
 * as the core reaches it through dlsym.
 *
 * Without a GPU (this program's main use in CI):
 *  - the backend file of a CUDA build exports the fr_cuda_nccl_* entry points
 *    exactly when the build had NCCL (config.h: FR_CONFIG_NCCL), and the core
 *    found them (fr_cuda_backend_has_nccl); a CUDA=0 build has neither;
 *  - every NCCL entry point of the core then fails with FR_ERR_DEVICE and a
 *    message that says what is missing: the GPU (the backend's own reason,
 *    "no NVIDIA driver" here), or the backend, and dist's GPU selection
 *    says that CUDA training across processes needs NCCL;
 *  - the copy of the backend linked without NCCL (build/tests/no-nccl/, made
 *    by a CUDA build that has NCCL), opened through FR_CUDA_BACKEND by a
 *    child process, loads, lacks the entry points, and the core's message
 *    says the backend was built without NCCL.
 * With a GPU: a one-rank communicator on it (no MPI needed) sums, in f32
 * and f64, and broadcasts, leaving the values as they were, and the results
 * are only read after fr_cuda_nccl_wait ordered the main stream after them.
 * The 2-process comparison with gradient accumulation is test_dist.c's
 * "exact-cuda" case (it needs MPI and two GPUs). */
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "cuda/fr_cuda.h"
#include "dist/dist.h"
#include "testlib.h"

static const char *const entry_points[] = {
    "fr_cuda_nccl_unique_id", "fr_cuda_nccl_new",  "fr_cuda_nccl_free",
    "fr_cuda_nccl_sum_start", "fr_cuda_nccl_broadcast_start", "fr_cuda_nccl_wait",
};
enum { N_ENTRY = sizeof entry_points / sizeof *entry_points };

static char build_dir[PATH_MAX]; /* the folder above this program's */

/* How many of the entry points the backend file at path exports; -1 when
 * it does not open. */
static int exported(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("     %s: %s\n", path, dlerror());
        return -1;
    }
    int n = 0;
    for (int i = 0; i < N_ENTRY; i++)
        n += dlsym(h, entry_points[i]) != NULL;
    /* the device selection that dist uses is there in every backend */
    CHECK(dlsym(h, "fr_cuda_select_device") != NULL);
    return n; /* the handle stays open (as the core's does) */
}

static void test_backend_exports_nccl(void) {
    if (!FR_CONFIG_CUDA) {
        CHECK(!fr_cuda_backend_has_nccl());
        SKIP("a CUDA=0 build has no backend file to look into");
    }
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", build_dir, FR_CONFIG_CUDA_BACKEND);
    int n = exported(path);
    printf("     %s exports %d of %d NCCL entry points (FR_CONFIG_NCCL %d)\n", path, n, N_ENTRY, FR_CONFIG_NCCL);
    CHECK(n == (FR_CONFIG_NCCL ? N_ENTRY : 0));
    const char *off = getenv("FR_CUDA");
    if (off && !strcmp(off, "0"))
        SKIP("FR_CUDA=0: the core does not open the backend");
    CHECK(fr_cuda_backend_has_nccl() == (bool)FR_CONFIG_NCCL);
}

/* What every NCCL entry point of the core says when it cannot run. */
static void check_refused(const char *needle) {
    unsigned char id[FR_CUDA_NCCL_ID_BYTES];
    fr_cuda_nccl *comm = NULL; /* each call must stop before it is used */
    float buf[4] = {0};
    void *bufs[1] = {buf};
    size_t bytes[1] = {sizeof buf};
    CHECK_ERR(fr_cuda_nccl_unique_id(id), FR_ERR_DEVICE, needle);
    fr_cuda_nccl *made = (fr_cuda_nccl *)id; /* must come back NULL */
    CHECK_ERR(fr_cuda_nccl_new(&made, id, 0, 1), FR_ERR_DEVICE, needle);
    CHECK(made == NULL);
    CHECK_ERR(fr_cuda_nccl_sum_start(comm, buf, 4, false), FR_ERR_DEVICE, needle);
    CHECK_ERR(fr_cuda_nccl_broadcast_start(comm, bufs, bytes, 1, 0), FR_ERR_DEVICE, needle);
    CHECK_ERR(fr_cuda_nccl_wait(comm), FR_ERR_DEVICE, needle);
    CHECK_ERR(fr_cuda_nccl_ready("dist"), FR_ERR_DEVICE, needle);
    int chosen = -1;
    if (fr_cuda_device_count() == 0)
        CHECK_ERR(fr_cuda_select_device(0, &chosen), FR_ERR_DEVICE, "no CUDA");
    /* dist checks NCCL before it picks a GPU (a build without MPI says that) */
    if (fr_dist_built())
        CHECK_ERR(fr_dist_select_gpu(NULL), FR_ERR_DEVICE, "needs NCCL");
    else
        CHECK_ERR(fr_dist_select_gpu(NULL), FR_ERR_ARG, "without MPI");
    printf("     refused: %s\n", fr_last_error());
}

static void test_refused_without_gpu(void) {
    if (fr_t_have_cuda())
        SKIP("a GPU is present");
    const char *why = fr_cuda_unavailable_reason();
    CHECK(strlen(why) > 10);
    if (fr_cuda_backend_has_nccl())
        check_refused(why); /* the GPU is what is missing: the backend's reason */
    else if (FR_CONFIG_CUDA)
        check_refused("built without NCCL");
    else
        check_refused("not available");
}

/* The child of test_backend_without_nccl, under FR_CUDA_BACKEND. */
static void child_without_nccl(void) {
    CHECK(!fr_cuda_backend_has_nccl());
    check_refused("the CUDA backend was built without NCCL");
}

static void test_backend_without_nccl(void) {
    if (!FR_CONFIG_CUDA || !FR_CONFIG_NCCL)
        SKIP("no NCCL-less copy of the backend in this build (it comes with a CUDA build that has NCCL)");
    char path[PATH_MAX + 64], self[PATH_MAX];
    snprintf(path, sizeof path, "%s/tests/no-nccl/%s", build_dir, FR_CONFIG_CUDA_BACKEND);
    CHECK(exported(path) == 0);
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("FR_CUDA_BACKEND", path, 1);
        execl(self, self, "--child-without-nccl", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ---- on a GPU ---- */

static void test_one_rank_communicator(void) {
    NEED_CUDA();
    CHECK(fr_cuda_backend_has_nccl());
    if (!fr_cuda_backend_has_nccl())
        return;
    unsigned char id[FR_CUDA_NCCL_ID_BYTES];
    CHECK_OK(fr_cuda_nccl_unique_id(id));
    fr_cuda_nccl *comm = NULL;
    CHECK_OK(fr_cuda_nccl_new(&comm, id, 0, 1));
    CHECK_ERR(fr_cuda_nccl_new(&(fr_cuda_nccl *){NULL}, id, 1, 1), FR_ERR_ARG, "rank 1 of 1");
    enum { N = 1000 };
    float host[N], back[N];
    double dh[7] = {1, -2.5, 3e300, 0, 1e-300, 7, 0.5}, db[7];
    for (int i = 0; i < N; i++)
        host[i] = (float)i * 0.37f - 100.0f;
    float *dev = fr_mem_alloc(FR_CUDA, sizeof host, FR_TAG_WORKSPACE);
    double *dd = fr_mem_alloc(FR_CUDA, sizeof dh, FR_TAG_WORKSPACE);
    CHECK(dev && dd);
    CHECK_OK(fr_cuda_memcpy(dev, host, sizeof host, FR_COPY_H2D));
    CHECK_OK(fr_cuda_memcpy(dd, dh, sizeof dh, FR_COPY_H2D));
    CHECK_OK(fr_cuda_nccl_sum_start(comm, dev, N, false));
    CHECK_OK(fr_cuda_nccl_sum_start(comm, dd, 7, true));
    void *bufs[2] = {dev, dd};
    size_t bytes[2] = {sizeof host, sizeof dh};
    CHECK_OK(fr_cuda_nccl_broadcast_start(comm, bufs, bytes, 2, 0));
    CHECK_OK(fr_cuda_nccl_wait(comm));
    CHECK_OK(fr_cuda_memcpy(back, dev, sizeof back, FR_COPY_D2H));
    CHECK_OK(fr_cuda_memcpy(db, dd, sizeof db, FR_COPY_D2H));
    CHECK(!memcmp(back, host, sizeof host)); /* the sum over one rank is the value */
    CHECK(!memcmp(db, dh, sizeof dh));
    fr_mem_free(FR_CUDA, dev, sizeof host, FR_TAG_WORKSPACE);
    fr_mem_free(FR_CUDA, dd, sizeof dh, FR_TAG_WORKSPACE);
    fr_cuda_nccl_free(comm);
}

int main(int argc, char **argv) {
    ssize_t n = readlink("/proc/self/exe", build_dir, sizeof build_dir - 1);
    build_dir[n > 0 ? n : 0] = 0;
    for (int up = 0; up < 2; up++) { /* build/tests/test_nccl -> build */
        char *slash = strrchr(build_dir, '/');
        if (slash)
            *slash = 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--child-without-nccl")) {
        RUN(child_without_nccl);
        return TEST_SUMMARY();
    }
    RUN(test_backend_exports_nccl);
    RUN(test_refused_without_gpu);
    RUN(test_backend_without_nccl);
    RUN(test_one_rank_communicator);
    return TEST_SUMMARY();
}
