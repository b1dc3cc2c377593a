/* state_impl.h (internal to train/state*.c): the metadata names and
 * bounds the training-state writer (state.c) and reader
 * (state_info.c) share. */
#ifndef FR_STATE_IMPL_H
#define FR_STATE_IMPL_H

#include "state.h"

#define OPTIM_PREFIX "optim."
#define STEP_SLOT "step"
#define AMP_PRECISION "amp.precision"
#define AMP_SCALE "amp.scale"
#define AMP_TRACKER "amp.growth_tracker"
#define AMP_SKIPPED "amp.skipped"
/* Counters stay below 2^53: exact as doubles (the schedule's arithmetic) and
 * far from overflowing as the run goes on. */
#define MAX_COUNT ((int64_t)1 << 53)
/* Hyperparameters a file may hold: finite and within these. */
#define MAX_RATE 1e6

static const char *const optim_kind_names[FR_OPTIM_KIND_COUNT] = {"sgd", "adam", "adamw"};
static const char *const sched_kind_names[FR_SCHED_KIND_COUNT] = {"constant", "step", "cosine"};
FR_STATIC_ASSERT(FR_OPTIM_KIND_COUNT == 3, "optimizer kind names");
FR_STATIC_ASSERT(FR_SCHED_KIND_COUNT == 3, "schedule kind names");

/* The metadata of an open file into *info (fr_state_read_info's work). */
fr_status fr_state_read_info_from(const fr_st_file *f, const char *path, fr_state_info *info);

#endif
