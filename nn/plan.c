/* plan.c: byte-balanced checkpoint segments; see plan.h. */
#include "plan.h"

#include <stdlib.h>

#include "../autograd/autograd.h"

size_t fr_plan_elem_bytes(void) {
    /* the forward's activations are in the autocast dtype; BN statistics and
     * other per-channel f32 values are too small to count */
    return fr_dtype_size(fr_autocast_dtype());
}

double fr_plan_peak(const double *block_cost, const double *input_cost, int n, const int *seg_len,
                    int n_seg) {
    double inputs = 0, peak = 0;
    for (int s = 0, i = 0; s < n_seg && i < n; i += seg_len[s], s++) {
        double cost = 0;
        for (int j = i; j < i + seg_len[s] && j < n; j++)
            cost += block_cost[j];
        inputs += input_cost[i];
        /* replaying segment s: its cost on top of every input still held */
        if (inputs + cost > peak)
            peak = inputs + cost;
    }
    return peak > inputs ? peak : inputs;
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
 * while (inputs held so far, its own included) + its cost stays <= limit.
 * Returns the number of segments, or 0 when some block cannot fit. Because
 * inputs held accumulate, later segments come out shorter: what a constant
 * budget cannot do. */
static int split_under(const double *block_cost, const double *input_cost, int n, double limit,
                       int *seg_len) {
    int n_seg = 0;
    double held = 0;
    for (int i = 0; i < n;) {
        held += input_cost[i];
        double cost = block_cost[i];
        if (held + cost > limit)
            return 0;
        int len = 1;
        while (i + len < n && held + cost + block_cost[i + len] <= limit)
            cost += block_cost[i + len++];
        seg_len[n_seg++] = len;
        i += len;
    }
    return n_seg;
}

static void keep_if_better(const double *block_cost, const double *input_cost, int n,
                           const int *trial, int t, int *seg_len, int *best_n, double *best_peak) {
    double peak = fr_plan_peak(block_cost, input_cost, n, trial, t);
    if (*best_peak < 0 || peak < *best_peak || (peak == *best_peak && t < *best_n)) {
        *best_peak = peak;
        *best_n = t;
        for (int s = 0; s < t; s++)
            seg_len[s] = trial[s];
    }
}

int fr_plan_segments(const double *block_cost, const double *input_cost, int n, int *seg_len) {
    if (n <= 0)
        return 0;
    int *trial = malloc((size_t)n * sizeof *trial);
    if (!trial) { /* no room to search: one block per segment is always valid */
        for (int i = 0; i < n; i++)
            seg_len[i] = 1;
        return n;
    }
    int best_n = 0;
    double best_peak = -1;
    /* The budgets worth trying are the costs of contiguous runs: any other
     * value splits like the largest run cost below it. */
    for (int a = 0; a < n; a++) {
        double run = 0;
        for (int z = a; z < n; z++) {
            run += block_cost[z];
            int t = split(block_cost, n, run, trial);
            keep_if_better(block_cost, input_cost, n, trial, t, seg_len, &best_n, &best_peak);
        }
    }
    /* Then bisect on the peak itself with the prefix-aware split. One block
     * per segment always fits under the sum of everything. */
    double lo = 0, hi = 0;
    for (int i = 0; i < n; i++)
        hi += block_cost[i] + input_cost[i];
    for (int iter = 0; iter < 64; iter++) {
        double mid = 0.5 * (lo + hi);
        if (split_under(block_cost, input_cost, n, mid, trial))
            hi = mid;
        else
            lo = mid;
    }
    int t = split_under(block_cost, input_cost, n, hi, trial);
    if (t)
        keep_if_better(block_cost, input_cost, n, trial, t, seg_len, &best_n, &best_peak);
    free(trial);
    return best_n;
}
