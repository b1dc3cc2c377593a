/* plan_search.h: the planner's layout search, internal to planner/ (plan_search.c does it,
 * planner.c turns its layouts into plans). A layout cuts the root sequence's steps (units) into
 * groups, each kept or checkpointed and each under one strategy of the profile. */
#ifndef FR_PLANNER_PLAN_SEARCH_H
#define FR_PLANNER_PLAN_SEARCH_H

#include "planner.h"
#include "profile.h"

/* The predicted curve, when asked for: points at base + level. */
typedef struct {
    fr_plan_point *pts;
    int n, cap;
    double ms, base;
} plan_curve;

/* Groups in order: units [start, start + len) under strategy, checkpointed when ckpt. */
typedef struct {
    int n_groups;
    int start[512], len[512], strategy[512];
    bool ckpt[512];
} plan_layout;

typedef struct {
    const fr_profile *p;
    double statics;   /* parameters, batch, optimizer state (+ all gradients when accumulating) */
    bool accumulating;
    double *grads_after; /* (n + 1): gradient bytes of units >= j (0 when accumulating) */
} plan_context;

/* What the layout search minimises */
enum { FR_PLAN_LEAST_TIME, FR_PLAN_LEAST_PEAK };

plan_context fr_plan_make_context(const fr_profile *p, const fr_plan_options *o, int batch, bool accumulating);
/* Peak and time of a whole layout, and its curve when asked (out may be NULL). */
bool fr_plan_simulate(const plan_context *cx, const plan_layout *s, double *peak, double *ms, plan_curve *out);
/* Chooses a layout: FR_PLAN_LEAST_TIME the least time whose peak is <= budget,
 * FR_PLAN_LEAST_PEAK the least peak. false when none (or out of memory). */
bool fr_plan_search(const plan_context *cx, int mode, double budget, plan_layout *best);
/* One strategy k everywhere; seg_k: 0 keeps everything, -1 Chen's split (nn/seg_split.h, as
 * "checkpoint" runs it), > 0 that many steps a segment. false when a unit cannot take k. */
bool fr_plan_uniform_layout(const fr_profile *p, int k, int seg_k, plan_layout *s);

#endif
