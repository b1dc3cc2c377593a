/* memreport.h: what the memreport program (programs/program_memreport.c)
 * shares with its plot (programs/memreport_svg.c). Internal to programs/. */
#ifndef FR_PROGRAMS_MEMREPORT_H
#define FR_PROGRAMS_MEMREPORT_H

#include "frugal.h"

typedef struct {
    const char *model;
    int batch, size, in_channels, classes, steps;
    fr_device device;
    const char *strategies;
    bool strategies_given; /* --strategies was given (else a default list) */
    const char *svg;
    bool svg_time;  /* x axis in milliseconds instead of ledger events */
    uint64_t seed;
    fr_dtype precision;  /* f32: one row per strategy; f16 / bf16: f32 and this */
    size_t memory_limit; /* --memory-limit: ledger cap per device, 0 = none */
    size_t memory_budget; /* --memory-budget: a row for the planner's step (planner/planner.h) */
    bool allow_compress;  /* --allow-compress: the planner may compress blocks */
} options;

/* ---- the trace: filled from the ledger's observer, which runs with the
 * ledger lock held, so it only writes into memory allocated beforehand ---- */

typedef struct {
    size_t *bytes;       /* (cap) total bytes in use after each event */
    double *ms;          /* (cap) time of the event since the series began */
    size_t cap, n;
    bool on, overflow;
    fr_device device;
    double t0;
} trace_buf;

/* One strategy's part of the trace: samples [start, start + count). */
typedef struct {
    size_t start, count;
    size_t backward_at, optim_at;  /* sample index (relative) where each phase begins */
} series;

typedef struct {
    char name[64];       /* the strategy */
    char label[80];      /* name, and the precision when the table shows two */
    fr_strategy strategy;
    fr_dtype precision;
    bool ok;
    char error[160];
    fr_mem_stats mem;   /* peaks over the timed steps */
    size_t resident;    /* the process's peak resident bytes over them (0: unknown) */
    double step_ms;     /* median */
    series trace;
    bool planned;       /* the planner's step for --memory-budget */
} row;

static inline double fr_memreport_mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* Draws the bytes in use over the first timed step of every row (and the
 * planner's predicted points when plan->points is set) into o->svg. 0 when
 * written, 1 after printing why not. */
int fr_memreport_svg(const options *o, const fr_model *m, const row *rows, int n, const trace_buf *t,
                     const fr_memory_plan *plan);

#endif
