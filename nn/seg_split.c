/* seg_split.c: checkpoint segments chosen by the total peak they reach; see
 * seg_split.h. */
#include "seg_split.h"

#include <stdlib.h>

#include "../autograd/autograd.h"

size_t fr_seg_elem_bytes(void) {
    /* the forward's activations are in the autocast dtype; BN statistics and
     * other per-channel f32 values are too small to count */
    return fr_dtype_size(fr_autocast_dtype());
}

static double at(const double *a, int i) { return a ? a[i] : 0; }

double fr_seg_peak(const fr_seg_costs *c, const int *seg_len, int n_seg) {
    double held = 0, peak = 0;
    for (int s = 0, a = 0; s < n_seg && a < c->n; a += seg_len[s], s++) {
        int b = a + seg_len[s] < c->n ? a + seg_len[s] : c->n;
        held += c->input[a];
        /* backward through step j of segment s (after its replay): every
         * segment input so far, what steps a..j keep (a step's input is
         * kept by it unless it starts the segment, where the checkpoint
         * holds it), and the gradients of step j's output and input */
        double kept = 0;
        for (int j = a; j < b; j++) {
            kept += c->cost[j] + (j > a ? at(c->input_kept, j) : 0);
            double grads = c->input[j] + (j + 1 < c->n ? c->input[j + 1] : 0);
            if (held + kept + grads > peak)
                peak = held + kept + grads;
        }
    }
    return peak > held ? peak : held;
}

/* Greedy split under budget b; returns the number of segments. */
static int split(const double *block_cost, int n, double b, int *seg_len) {
    int n_seg = 0;
    for (int i = 0; i < n;) {
        double cost = block_cost[i];
        int len = 1;
        while (i + len < n && cost + block_cost[i + len] <= b)
            cost += block_cost[i + len++];
        seg_len[n_seg++] = len;
        i += len;
    }
    return n_seg;
}

/* Greedy split that keeps every replay under `limit`: each segment grows
 * while its estimated peak (fr_seg_peak's terms, inputs held so far
 * included) stays <= limit. Returns the number of segments, or 0 when some
 * step cannot fit. Because inputs held accumulate, later segments come out
 * shorter: what a constant budget cannot do. */
static int split_under(const fr_seg_costs *c, double limit, int *seg_len) {
    int n_seg = 0, n = c->n;
    double held = 0;
    for (int i = 0; i < n;) {
        held += c->input[i];
        double kept = 0;
        int len = 0;
        while (i + len < n) {
            int j = i + len;
            double k = kept + c->cost[j] + (len ? at(c->input_kept, j) : 0);
            double grads = c->input[j] + (j + 1 < n ? c->input[j + 1] : 0);
            if (held + k + grads > limit)
                break;
            kept = k;
            len++;
        }
        if (!len)
            return 0;
        seg_len[n_seg++] = len;
        i += len;
    }
    return n_seg;
}

static void keep_if_better(const fr_seg_costs *c, const int *trial, int t, int *seg_len,
                           int *best_n, double *best_peak) {
    double peak = fr_seg_peak(c, trial, t);
    if (*best_peak < 0 || peak < *best_peak || (peak == *best_peak && t < *best_n)) {
        *best_peak = peak;
        *best_n = t;
        for (int s = 0; s < t; s++)
            seg_len[s] = trial[s];
    }
}

/* The estimate leaves out what a step allocates inside its own backward
 * (workspace, a recomputed norm output, gradients of its inner tensors), which
 * a replay adds on top of the held inputs; so a split is kept only when its
 * estimate is clearly (by a fifth) below the uncut sequence's, else the
 * sequence stays uncut (one segment: the same peak as no checkpoint). */
#define CUT_MARGIN 0.8

static int worth_cutting(double best, double uncut, int n, int *seg_len, int best_n) {
    if (best_n > 1 && best > CUT_MARGIN * uncut) {
        seg_len[0] = n;
        return 1;
    }
    return best_n;
}

/* Up to this many steps every split is tried (2^(n-1) of them). */
#define EXHAUSTIVE_STEPS 14

int fr_seg_split(const fr_seg_costs *c, int *seg_len) {
    int n = c->n;
    if (n <= 0)
        return 0;
    int *trial = malloc((size_t)n * sizeof *trial);
    if (!trial) { /* no room to search: one segment, the chain as it is */
        seg_len[0] = n;
        return 1;
    }
    int best_n = 0;
    double best_peak = -1;
    /* One segment first: the sequence uncut, so no other split is kept
     * unless its estimated peak is lower (checkpoint never plans above the
     * same strategy without it). */
    trial[0] = n;
    keep_if_better(c, trial, 1, seg_len, &best_n, &best_peak);
    double uncut = best_peak;
    if (n <= EXHAUSTIVE_STEPS) {
        for (unsigned mask = 0; mask < 1u << (n - 1); mask++) { /* bit j: a cut after step j */
            int t = 0, len = 0;
            for (int j = 0; j < n; j++) {
                len++;
                if (j == n - 1 || (mask >> j & 1)) {
                    trial[t++] = len;
                    len = 0;
                }
            }
            keep_if_better(c, trial, t, seg_len, &best_n, &best_peak);
        }
        free(trial);
        return worth_cutting(best_peak, uncut, n, seg_len, best_n);
    }
    /* Equal runs of k steps, then Chen's budgets: the costs of contiguous
     * runs (any other value splits like the largest run cost below it). */
    for (int k = 1; k < n; k++) {
        int t = 0;
        for (int i = 0; i < n; i += k)
            trial[t++] = i + k <= n ? k : n - i;
        keep_if_better(c, trial, t, seg_len, &best_n, &best_peak);
    }
    for (int a = 0; a < n; a++) {
        double run = 0;
        for (int z = a; z < n; z++) {
            run += c->cost[z] + at(c->input_kept, z);
            int t = split(c->cost, n, run, trial);
            keep_if_better(c, trial, t, seg_len, &best_n, &best_peak);
        }
    }
    /* Then bisect on the peak itself with the prefix-aware split. One step
     * per segment always fits under the sum of everything. */
    double lo = 0, hi = 0;
    for (int i = 0; i < n; i++)
        hi += c->cost[i] + at(c->input_kept, i) + 2 * c->input[i];
    for (int iter = 0; iter < 64; iter++) {
        double mid = 0.5 * (lo + hi);
        if (split_under(c, mid, trial))
            hi = mid;
        else
            lo = mid;
    }
    int t = split_under(c, hi, trial);
    if (t)
        keep_if_better(c, trial, t, seg_len, &best_n, &best_peak);
    free(trial);
    return worth_cutting(best_peak, uncut, n, seg_len, best_n);
}
