/* memreport_svg.c: memreport's plot (programs/memreport.h), the bytes in use
 * over one training step per strategy, as hand-written SVG. */
#include <math.h>
#include <stdio.h>

#include "io/outfile.h"
#include "planner/planner.h"
#include "programs/memreport.h"

#define mib fr_memreport_mib

/* ---- the plot: hand-written SVG ---- */

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
enum { N_COLOURS = sizeof palette / sizeof *palette };

/* A tick spacing of 1, 2 or 5 times a power of ten giving at most `max` ticks. */
static double nice_step(double range, int max) {
    if (range <= 0)
        return 1;
    double raw = range / max, p = 1;
    while (p * 10 <= raw)
        p *= 10;
    while (p > raw)
        p /= 10;
    return raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
}

static double sample_x(const options *o, const trace_buf *t, const series *s, size_t i) {
    return o->svg_time ? t->ms[s->start + i] : (double)i;
}

int fr_memreport_svg(const options *o, const fr_model *m, const row *rows, int n, const trace_buf *t,
                     const fr_memory_plan *plan) {
    fr_outfile *out = fr_outfile_open(o->svg);
    if (!out) {
        fprintf(stderr, "memreport: --svg: %s\n", fr_last_error());
        return 1;
    }
    FILE *f = fr_outfile_stream(out);
    const double W = 1100, H = 560, left = 80, right = 320, top = 50, bottom = 60;
    const double pw = W - left - right, ph = H - top - bottom;
    double xmax = 0, ymax = 0;
    for (int i = 0; i < n; i++) {
        const series *s = &rows[i].trace;
        if (!rows[i].ok || !s->count)
            continue;
        xmax = fmax(xmax, sample_x(o, t, s, s->count - 1));
        for (size_t j = 0; j < s->count; j++)
            ymax = fmax(ymax, mib(t->bytes[s->start + j]));
    }
    double xstep = nice_step(xmax, 8), ystep = nice_step(ymax, 8);
    xmax = xmax > 0 ? ceil(xmax / xstep) * xstep : 1;
    ymax = ymax > 0 ? ceil(ymax / ystep) * ystep : 1;
#define PX(v) (left + (v) / xmax * pw)
#define PY(v) (top + ph - (v) / ymax * ph)
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H, W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">memory in use "
               "over one training step: %s, batch %d, %dx%dx%d, %s</text>\n",
            left + pw / 2, m->name, o->batch, o->in_channels, o->size, o->size,
            fr_device_name(o->device));
    /* grid and ticks */
    for (double v = 0; v <= ymax + ystep / 2; v += ystep) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n",
                left, PY(v), left + pw, PY(v));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", left - 6,
                PY(v) + 4, v);
    }
    for (double v = 0; v <= xmax + xstep / 2; v += xstep) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n",
                PX(v), top, PX(v), top + ph);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", PX(v),
                top + ph + 18, v);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
               "stroke=\"black\"/>\n", left, top, pw, ph);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", left + pw / 2,
            H - 16, o->svg_time ? "time since the step began (ms)"
                                : "ledger event (allocation, free or retag) since the step began");
    fprintf(f, "<text transform=\"translate(20 %.1f) rotate(-90)\" text-anchor=\"middle\">"
               "total bytes in use (MiB)</text>\n", top + ph / 2);
    /* one line per strategy: per pixel column the lowest and highest sample,
     * in the order they happened, so no peak is lost to downsampling */
    int legend = 0;
    for (int i = 0; i < n; i++) {
        const series *s = &rows[i].trace;
        if (!rows[i].ok || !s->count)
            continue;
        const char *colour = palette[i % N_COLOURS];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", colour);
        size_t j = 0;
        while (j < s->count) {
            long col = lround(PX(sample_x(o, t, s, j)));
            size_t lo = j, hi = j, k = j;
            for (; k < s->count && lround(PX(sample_x(o, t, s, k))) == col; k++) {
                if (t->bytes[s->start + k] < t->bytes[s->start + lo])
                    lo = k;
                if (t->bytes[s->start + k] > t->bytes[s->start + hi])
                    hi = k;
            }
            size_t a = lo < hi ? lo : hi, b = lo < hi ? hi : lo;
            fprintf(f, "%ld,%.1f ", col, PY(mib(t->bytes[s->start + a])));
            if (b != a)
                fprintf(f, "%ld,%.1f ", col, PY(mib(t->bytes[s->start + b])));
            j = k;
        }
        fprintf(f, "\"/>\n");
        if (rows[i].planned && plan->n_points > 1 && s->count > 1) {
            /* the planner's curve, its predicted time stretched to this
             * row's measured step (one micro-batch of it when there are
             * several: the prediction is per micro-batch) */
            double extent = sample_x(o, t, s, s->count - 1) / (plan->accum > 1 ? plan->accum : 1);
            double span = plan->points[plan->n_points - 1].ms;
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                       "stroke-dasharray=\"2 3\" points=\"", colour);
            for (int p = 0; p < plan->n_points; p++)
                fprintf(f, "%.1f,%.1f ", PX(span > 0 ? plan->points[p].ms / span * extent : 0),
                        PY(fmin(mib(plan->points[p].bytes), ymax)));
            fprintf(f, "\"/>\n");
        }
        if (s->backward_at < s->count) {
            double bx = PX(sample_x(o, t, s, s->backward_at));
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                       "stroke-dasharray=\"5 4\"/>\n", bx, top, bx, top + ph, colour);
        }
        double ly = top + 10 + 20.0 * legend++;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                   "stroke-width=\"3\"/>\n", W - right + 15, ly, W - right + 40, ly, colour);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s (peak %.1f MiB)</text>\n", W - right + 46,
                ly + 4, rows[i].label, mib(rows[i].mem.total_peak));
    }
    double ly = top + 10 + 20.0 * legend;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\" "
               "stroke-dasharray=\"5 4\"/>\n", W - right + 15, ly, W - right + 40, ly);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">backward starts</text>\n", W - right + 46, ly + 4);
    if (plan->n_points > 1) {
        ly += 20;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\" "
                   "stroke-dasharray=\"2 3\"/>\n", W - right + 15, ly, W - right + 40, ly);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">planned: predicted (peak %.1f MiB)</text>\n",
                W - right + 46, ly + 4, mib((size_t)plan->predicted_peak));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">prediction's time scaled to "
                   "the measured step</text>\n", W - right + 46, ly + 18);
    }
    fprintf(f, "</svg>\n");
#undef PX
#undef PY
    if (fr_outfile_commit(out) != FR_OK) {
        fprintf(stderr, "memreport: --svg: %s\n", fr_last_error());
        return 1;
    }
    return 0;
}
