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

/* Bytes that hold the input of a segment over [a, b): a checkpoint's
 * (codes under compress), or, for the last segment when it runs as it is,
 * its first step's own (at full width: its input; under compress its codes
 * are in that step's cost already). */
static double held_by(const fr_seg_costs *c, int a, bool ckpt) {
    if (ckpt)
        return c->held ? c->held[a] : c->input[a];
    return c->held ? 0 : c->input[a];
}

/* Bytes of the masks a checkpointed segment over [a, b) keeps for its
 * replay: only where its input is kept as codes (an activation under
 * compress; a data batch is held as it is and its replay is exact). */
static double masks_by(const fr_seg_costs *c, int a, int b, bool ckpt) {
    double bytes = 0;
    if (ckpt && c->masks && c->held && c->input[a] > 0)
        for (int j = a; j < b; j++)
            bytes += c->masks[j];
    return bytes;
}

/* The peak of held + kept + (with_flight) the full-width tensors in flight:
 * fr_seg_peak, or without them fr_seg_saved. */
static double peak_of(const fr_seg_costs *c, const int *seg_len, int n_seg, bool with_flight) {
    double held = 0, peak = 0, masks_before = 0;
    for (int s = 0, a = 0; s < n_seg && a < c->n; a += seg_len[s], s++) {
        int b = a + seg_len[s] < c->n ? a + seg_len[s] : c->n;
        bool ckpt = !(c->last_as_is && b == c->n);
        /* the masks of the segments before this one are held while it
         * replays; its own are then the replayed steps' (in cost) */
        held += held_by(c, a, ckpt) + masks_before;
        masks_before = masks_by(c, a, b, ckpt);
        /* backward through step j of segment s (after its replay): every
         * segment input so far, what steps a..j keep (a step's input is
         * kept by it unless it starts the segment, where the checkpoint
         * holds it), and the gradients of step j's output and input */
        double kept = 0, out = b < c->n ? c->input[b] : 0;
        for (int j = a; j < b; j++) {
            kept += c->cost[j] + (j > a ? at(c->input_kept, j) - at(c->input_shared, j) : 0);
            double in_bwd = c->backward && c->backward[j] > c->input[j] ? c->backward[j] : c->input[j];
            double grads = in_bwd + (j + 1 < c->n ? c->input[j + 1] : 0);
            /* a replay beside codes: its decoded input and replayed output
             * at full width, and the segment's output gradient while an
             * earlier step runs backward (the replay's last step counts it
             * in grads) */
            double replay = ckpt && c->held ? c->input[a] + out + (j + 1 < b ? out : 0) : 0;
            double flight = with_flight ? grads + replay : 0;
            if (held + kept + flight > peak)
                peak = held + kept + flight;
        }
    }
    return peak > held + masks_before ? peak : held + masks_before;
}

double fr_seg_peak(const fr_seg_costs *c, const int *seg_len, int n_seg) {
    return peak_of(c, seg_len, n_seg, true);
}

double fr_seg_forward_saved(const fr_seg_costs *c, const int *seg_len, int n_seg) {
    double bytes = 0;
    for (int s = 0, a = 0; s < n_seg && a < c->n; a += seg_len[s], s++) {
        int b = a + seg_len[s] < c->n ? a + seg_len[s] : c->n;
        bool ckpt = !(c->last_as_is && b == c->n);
        bytes += held_by(c, a, ckpt) + masks_by(c, a, b, ckpt);
        for (int j = a; j < b && !ckpt; j++)
            bytes += c->cost[j] + (j > a ? at(c->input_kept, j) - at(c->input_shared, j) : 0);
    }
    return bytes;
}

double fr_seg_saved(const fr_seg_costs *c, const int *seg_len, int n_seg) {
    return peak_of(c, seg_len, n_seg, false);
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
        held += c->held ? c->held[i] : c->input[i];
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

/* The estimate is a model of the peak, not the peak (what a step allocates
 * inside its own backward is measured once per step, nn/segments.c, but
 * how those bytes overlap with the held ones is not); so a split is kept
 * only when its estimate is clearly (by a fifth) below the uncut
 * sequence's, else the sequence stays uncut (one segment: the same peak as
 * no checkpoint). */
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
