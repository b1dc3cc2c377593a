/* test_memory.c: the ledger counts exact bytes per tag, peaks, retagging,
 * limits (clear out-of-memory errors) and thread safety. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

static void test_exact_bytes_per_tag(void) {
    size_t p0 = fr_mem_current(FR_CPU, FR_TAG_PARAM), d0 = fr_mem_current(FR_CPU, FR_TAG_DATA);
    fr_tensor *w = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(10, 10), FR_TAG_PARAM);
    fr_tensor *x = fr_empty(FR_CPU, FR_U8, 1, FR_SHAPE(7), FR_TAG_DATA);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_PARAM) == p0 + 400);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_DATA) == d0 + 7);
    /* a view allocates nothing */
    fr_tensor *v = fr_view(w, 1, FR_SHAPE(100));
    CHECK(fr_mem_current(FR_CPU, FR_TAG_PARAM) == p0 + 400);
    fr_release(w);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_PARAM) == p0 + 400); /* v keeps the storage */
    fr_release(v);
    fr_release(x);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_PARAM) == p0);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_DATA) == d0);
}

static void test_peaks_and_reset(void) {
    fr_mem_reset_peak();
    size_t base = fr_mem_total_current(FR_CPU);
    fr_tensor *a = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(1000), FR_TAG_TRANSIENT);
    fr_tensor *b = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(500), FR_TAG_WORKSPACE);
    fr_release(b);
    fr_tensor *c = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(100), FR_TAG_TRANSIENT);
    fr_mem_stats s;
    fr_mem_get_stats(FR_CPU, &s);
    CHECK(s.total_peak == base + 6000);
    CHECK(s.peak[FR_TAG_WORKSPACE] >= 2000);
    /* at the total peak, the workspace held 2000 of the 6000 bytes */
    CHECK(s.at_peak[FR_TAG_WORKSPACE] == 2000);
    CHECK(s.at_peak[FR_TAG_TRANSIENT] + 400 == s.current[FR_TAG_TRANSIENT]);
    fr_release(a);
    fr_release(c);
    fr_mem_reset_peak();
    CHECK(fr_mem_total_peak(FR_CPU) == base);
    CHECK(fr_mem_peak(FR_CPU, FR_TAG_WORKSPACE) == fr_mem_current(FR_CPU, FR_TAG_WORKSPACE));
}

static void test_saved_retag(void) {
    size_t t0 = fr_mem_current(FR_CPU, FR_TAG_TRANSIENT), s0 = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    fr_tensor *act = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(64), FR_TAG_TRANSIENT);
    fr_tensor *par = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(8), FR_TAG_PARAM);
    fr_storage_mark_saved(act->storage);
    fr_storage_mark_saved(act->storage);
    fr_storage_mark_saved(par->storage);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == s0 + 256);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_TRANSIENT) == t0);
    /* a saved parameter is still counted as a parameter */
    CHECK(par->storage->tag == FR_TAG_PARAM);
    fr_storage_unmark_saved(act->storage);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == s0 + 256);
    fr_storage_unmark_saved(act->storage);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == s0);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_TRANSIENT) == t0 + 256);
    fr_storage_unmark_saved(par->storage);
    fr_release(act);
    fr_release(par);
}

static void test_limit_gives_clear_oom(void) {
    size_t base = fr_mem_total_current(FR_CPU);
    fr_mem_set_limit(FR_CPU, base + 4096);
    fr_tensor *ok = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(1000), FR_TAG_TRANSIENT);
    CHECK_NOTNULL(ok);
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(100), FR_TAG_SAVED)), FR_ERR_OOM,
              "out of memory on cpu: 400 B for saved");
    CHECK(strstr(fr_last_error(), "limit") != NULL);
    CHECK(strstr(fr_last_error(), "during") == NULL); /* no phase set */
    /* the phase and step the program is in end the message (issue 22) */
    fr_mem_set_phase("training", 3);
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(100), FR_TAG_WORKSPACE)), FR_ERR_OOM,
              "400 B for workspace");
    CHECK(strstr(fr_last_error(), " during training step 3") != NULL);
    fr_mem_set_phase("evaluation", 0);
    CHECK(fr_mem_phase() && !strcmp(fr_mem_phase(), "evaluation"));
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(100), FR_TAG_SAVED)), FR_ERR_OOM,
              "during evaluation");
    fr_mem_set_phase(NULL, 0);
    CHECK(!fr_mem_phase());
    fr_mem_set_limit(FR_CPU, 0);
    fr_release(ok);
    CHECK(fr_mem_total_current(FR_CPU) == base);
    /* a request the system refuses is an error too, not a crash */
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE((int64_t)1 << 60), FR_TAG_DATA)),
              FR_ERR_SHAPE, "too large");
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CPU, FR_U8, 1, FR_SHAPE((int64_t)1 << 56), FR_TAG_DATA)),
              FR_ERR_OOM, "out of memory on cpu");
}

static void test_report_names_every_tag(void) {
    fr_tensor *w = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(256), FR_TAG_PARAM);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    fr_mem_report(f);
    fclose(f);
    CHECK(strstr(text, "memory on cpu") != NULL);
    for (int t = 0; t < FR_TAG_COUNT; t++)
        CHECK(strstr(text, fr_mem_tag_name((fr_mem_tag)t)) != NULL);
    free(text);
    fr_release(w);
}

static void *churn(void *arg) {
    (void)arg;
    for (int i = 0; i < 2000; i++) {
        fr_tensor *t = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(16 + i % 7), FR_TAG_DATA);
        fr_release(t);
    }
    return NULL;
}

static void test_thread_safe(void) {
    size_t base = fr_mem_current(FR_CPU, FR_TAG_DATA);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, churn, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_DATA) == base);
}

static size_t traced_events;
static void count_events(void *user, fr_device dev, const fr_mem_stats *now) {
    (void)user;
    (void)now;
    if (dev == FR_CPU)
        traced_events++;
}

static void test_trace_sees_each_change(void) {
    traced_events = 0;
    fr_mem_set_trace(count_events, NULL);
    fr_tensor *t = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(4), FR_TAG_DATA);
    fr_release(t);
    fr_mem_set_trace(NULL, NULL);
    CHECK(traced_events == 2);
}

int main(void) {
    RUN(test_exact_bytes_per_tag);
    RUN(test_peaks_and_reset);
    RUN(test_saved_retag);
    RUN(test_limit_gives_clear_oom);
    RUN(test_report_names_every_tag);
    RUN(test_thread_safe);
    RUN(test_trace_sees_each_change);
    return TEST_SUMMARY();
}
