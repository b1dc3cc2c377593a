/* watchdog.c: a time limit on every wait for the other processes.
 *
 * MPI's TCP transport waits on a silent socket for ever: a process whose
 * peer's machine lost its link never learns it, and ends only when Open
 * MPI's daemon on its machine notices that mpirun is gone (TCP keepalive,
 * and only while that connection has nothing unacknowledged to send; a
 * daemon forwarding rank 0's output at the moment of the cut waits for TCP's
 * retransmission limit instead, about 15 minutes). So each blocking wait in
 * dist/ (collectives, MPI_Wait on the gradient all-reduces, the NCCL wait)
 * is bracketed by fr_dist_wait_begin/end, and a thread of its own ends the
 * process when one lasts longer than the limit (fr_dist_set_timeout),
 * naming the wait, the rank and the machine (docs/DISTRIBUTED.md, "Faults").
 * The thread cannot return an error through the blocked call, so it exits:
 * a process stuck in MPI has no state worth saving, and its daemon then
 * reports the exit to mpirun, which ends the others. */
#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* The monotonic clock, and the condition variable waits on it too
 * (fr_dist_watchdog_start): a step of the wall clock (NTP, a resumed VM)
 * must neither end a healthy job nor put off a real timeout. */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fire(fr_dist *d, const char *what, double waited) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    fflush(stdout);
    fprintf(stderr,
            "frugal: rank %d on %s: %s has waited %.1f s for the other processes (limit %g s, "
            "train's --dist-timeout): a process or the network to it is lost; ending rank %d "
            "with exit code %d\n",
            d->rank, host, what, waited, d->wd.timeout, d->rank, FR_DIST_TIMEOUT_EXIT);
    fflush(stderr);
    _exit(FR_DIST_TIMEOUT_EXIT);
}

static void *watch(void *arg) {
    fr_dist *d = arg;
    fr_dist_watchdog *w = &d->wd;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        if (!w->what || w->timeout <= 0) {
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        unsigned long gen = w->gen;
        double deadline = w->since + w->timeout;
        struct timespec ts = {.tv_sec = (time_t)deadline,
                              .tv_nsec = (long)((deadline - (double)(time_t)deadline) * 1e9)};
        int rc = pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        /* the same wait still running past its deadline */
        if (rc == ETIMEDOUT && !w->stop && w->what && w->gen == gen && now() >= deadline)
            fire(d, w->what, now() - w->since);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

void fr_dist_watchdog_start(fr_dist *d) {
    fr_dist_watchdog *w = &d->wd;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->timeout = FR_DIST_DEFAULT_TIMEOUT;
    w->running = pthread_create(&w->thread, NULL, watch, d) == 0;
}

void fr_dist_watchdog_stop(fr_dist *d) {
    fr_dist_watchdog *w = &d->wd;
    if (w->running) {
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

fr_status fr_dist_set_timeout(fr_dist *d, double seconds) {
    if (!(seconds >= 0))
        return fr_error(FR_ERR_ARG, "dist: timeout %g s: must be 0 (none) or more", seconds);
    if (!d->wd.running && seconds > 0)
        return fr_error(FR_ERR_IO, "dist: the watchdog thread could not be started, so a timeout cannot be kept");
    pthread_mutex_lock(&d->wd.mu);
    d->wd.timeout = seconds;
    pthread_cond_signal(&d->wd.cv);
    pthread_mutex_unlock(&d->wd.mu);
    return FR_OK;
}

double fr_dist_timeout(const fr_dist *d) { return d ? d->wd.timeout : 0; }

void fr_dist_wait_begin(fr_dist *d, const char *what) {
    fr_dist_watchdog *w = &d->wd;
    if (!w->running)
        return;
    pthread_mutex_lock(&w->mu);
    w->what = what;
    w->since = now();
    w->gen++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void fr_dist_wait_end(fr_dist *d) {
    fr_dist_watchdog *w = &d->wd;
    if (!w->running)
        return;
    pthread_mutex_lock(&w->mu);
    w->what = NULL;
    w->gen++;
    pthread_mutex_unlock(&w->mu);
}
