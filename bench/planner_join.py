"""planner_join.py: the planner bench's table and SVG plot.

    planner_join.py [--svg FILE] [--date TEXT] RECORDS...

Reads the records of bench_planner (P lines, bench/bench_planner.c) and of
torch_checkpoint.py (T lines) from the files named, and prints Markdown:

1. per budget (the planner's evenly spaced budgets from its feasible minimum
   to plain's peak, then those equal to a fixed schedule's measured peak),
   in increasing order: the planner's predicted and measured peak, its step
   time and overhead over frugal's plain step, its micro-batches; frugal's
   sqrt(N) segments (checkpoint:K) and Chen's split (checkpoint) where their
   measured peak fits the budget; PyTorch's fastest checkpoint_sequential
   whose peak fits it (its K, peak, ms, overhead over PyTorch's plain step);
2. frugal's fixed schedules and every PyTorch run, each with its overhead.

Overhead = step ms / the same side's plain step ms - 1. With --svg it also
writes a plot of overhead against peak MiB (planner, frugal's fixed
schedules, PyTorch's checkpoint_sequential), hand-written SVG: every run a
marker, each series' fastest-at-its-memory points joined by a line.

A line that is neither a note (#), a P or T record of the right shape nor
blank is an error naming the file and line (exit 2), as is a file without
any P record.
"""
import argparse
import datetime
import html
import math
import sys

MIB = 1024.0 * 1024.0

# kind -> (field names, converters) after the "P"/"T" tag and the kind
RECORDS = {
    ("P", "model"): (("name", str), ("batch", int), ("units", int), ("steps", int), ("threads", int)),
    ("P", "load"): (("when", str), ("l1", float), ("l5", float), ("l15", float)),
    ("P", "fixed"): (("schedule", str), ("peak", int), ("ms", float)),
    ("P", "plan"): (("budget", int), ("predicted", float), ("peak", int), ("ms", float),
                    ("accum", int), ("equal", str)),
    ("T", "model"): (("name", str), ("batch", int), ("modules", int), ("steps", int),
                     ("threads", int)),
    ("T", "load"): (("when", str), ("l1", float), ("l5", float), ("l15", float)),
    ("T", "plain"): (("peak", int), ("ms", float)),
    ("T", "ckpt"): (("k", int), ("peak", int), ("ms", float)),
}


class RecordError(Exception):
    pass


def parse(paths):
    """{"notes": [...], (tag, kind): [record dicts]} from the files."""
    out = {"notes": []}
    for path in paths:
        try:
            f = open(path)
        except OSError as e:
            raise RecordError(f"{path}: {e.strerror}")
        with f:
            for n, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                if line.startswith("#"):
                    if line not in out["notes"]:
                        out["notes"].append(line)
                    continue
                fields = line.split("\t")
                spec = RECORDS.get(tuple(fields[:2]))
                if spec is None:
                    raise RecordError(f"{path}:{n}: not a planner record: {line[:60]!r}")
                if len(fields) != len(spec) + 2:
                    raise RecordError(f"{path}:{n}: {fields[0]} {fields[1]} takes {len(spec)} fields, "
                                      f"got {len(fields) - 2}")
                rec = {}
                for (name, conv), text in zip(spec, fields[2:]):
                    try:
                        rec[name] = conv(text)
                    except ValueError:
                        raise RecordError(f"{path}:{n}: field {name} of {fields[0]} {fields[1]}: "
                                          f"{text!r} is not a number")
                    if conv is not str and (not math.isfinite(rec[name]) or rec[name] < 0):
                        raise RecordError(f"{path}:{n}: field {name}: {text!r} out of range")
                out.setdefault(tuple(fields[:2]), []).append(rec)
    if not out.get(("P", "model")):
        raise RecordError("no bench_planner records (P model) in " + ", ".join(paths))
    return out


def mib(nbytes):
    return nbytes / MIB


def pct(ms, base):
    return 100.0 * (ms / base - 1.0) if base else None


def fmt_pct(v):
    return "-" if v is None else f"{v:+.1f}%"


def print_table(title, head, rows):
    widths = [max(len(r[c]) for r in [head] + rows) for c in range(len(head))]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    print(f"## {title}\n")
    print(line(head))
    print("|" + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":"
                         for i, w in enumerate(widths)) + "|")
    for r in rows:
        print(line(r))
    print()


def load_text(recs):
    by = {r["when"]: r["l1"] for r in recs or []}
    return "-".join(f"{by[w]:.2f}" for w in ("before", "after") if w in by) or "?"


def summarise(data):
    model = data[("P", "model")][-1]
    fixed = {r["schedule"]: r for r in data.get(("P", "fixed"), [])}
    plain = fixed.get("plain")
    if plain is None:
        raise RecordError("no frugal plain step (P fixed plain): no base for the overhead")
    sqrt_name = next((s for s in fixed if s.startswith("checkpoint:")), None)
    t_plain = (data.get(("T", "plain")) or [None])[-1]
    t_ckpt = data.get(("T", "ckpt"), [])
    return model, fixed, plain, sqrt_name, t_plain, t_ckpt


def fits(rec, budget):
    return rec is not None and rec["peak"] <= budget


def budget_table(data):
    model, fixed, plain, sqrt_name, t_plain, t_ckpt = summarise(data)
    plans = sorted(data.get(("P", "plan"), []), key=lambda r: (r["budget"], r["equal"]))
    head = ["budget MiB", "equal to", "planner pred. MiB", "planner MiB", "planner ms",
            "planner overhead", "micro-batches",
            f"sqrt(N) {sqrt_name or 'checkpoint:K'} overhead", "Chen (checkpoint) overhead",
            "torch best K", "torch MiB", "torch ms", "torch overhead"]
    rows, over = [], 0
    for p in plans:
        b = p["budget"]
        over += p["peak"] > b
        cells = [f"{mib(b):.2f}", p["equal"] if p["equal"] != "-" else "",
                 f"{mib(p['predicted']):.2f}",
                 f"{mib(p['peak']):.2f}" + (" OVER" if p["peak"] > b else ""),
                 f"{p['ms']:.1f}", fmt_pct(pct(p["ms"], plain["ms"])), str(p["accum"])]
        for name in (sqrt_name, "checkpoint"):
            r = fixed.get(name) if name else None
            cells.append(fmt_pct(pct(r["ms"], plain["ms"])) if fits(r, b) else
                         "does not fit" if r else "-")
        cands = [r for r in t_ckpt if r["peak"] <= b]
        if t_plain and t_plain["peak"] <= b:
            cands.append(dict(t_plain, k="plain"))
        best = min(cands, key=lambda r: r["ms"]) if cands else None
        if best:
            cells += [str(best["k"]), f"{mib(best['peak']):.2f}", f"{best['ms']:.1f}",
                      fmt_pct(pct(best["ms"], t_plain["ms"]) if t_plain else None)]
        else:
            cells += ["none fits" if t_ckpt or t_plain else "-", "", "", ""]
        rows.append(cells)
    t_model = (data.get(("T", "model")) or [None])[-1]
    title = (f"planner: step time against memory budget, {model['name']} batch {model['batch']}, "
             f"{model['threads']} threads (frugal)")
    if t_model:
        title += f" / {t_model['threads']} (PyTorch)"
    print_table(title, head, rows)
    print(f"overhead: step ms / the same side's plain step - 1 (frugal plain {plain['ms']:.1f} ms, "
          f"{mib(plain['peak']):.2f} MiB" +
          (f"; PyTorch plain {t_plain['ms']:.1f} ms, {mib(t_plain['peak']):.2f} MiB)" if t_plain
           else "; no PyTorch plain step)"))
    print(f"medians of {model['steps']} timed steps (frugal); frugal MiB: the ledger's total peak; "
          "PyTorch MiB: heap peak during the step - heap before it\n+ parameters, momentum and "
          "batch (bench/torch_checkpoint.py). A fixed schedule or PyTorch run counts at a budget "
          "when its measured peak is <= it.")
    if over:
        print(f"OVER on {over} budget(s): the planner's measured peak exceeded the budget")
    print(f"load average (1 min) frugal {load_text(data.get(('P', 'load')))}, PyTorch "
          f"{load_text(data.get(('T', 'load')))}")
    print()


def runs_table(data):
    model, fixed, plain, _, t_plain, t_ckpt = summarise(data)
    rows = [["frugal " + s, f"{mib(r['peak']):.2f}", f"{r['ms']:.1f}", fmt_pct(pct(r["ms"], plain["ms"]))]
            for s, r in fixed.items()]
    if t_plain:
        rows.append(["torch plain", f"{mib(t_plain['peak']):.2f}", f"{t_plain['ms']:.1f}", "+0.0%"])
    for r in sorted(t_ckpt, key=lambda r: r["k"]):
        rows.append([f"torch checkpoint_sequential K={r['k']}", f"{mib(r['peak']):.2f}",
                     f"{r['ms']:.1f}", fmt_pct(pct(r["ms"], t_plain["ms"]) if t_plain else None)])
    print_table(f"planner: every fixed run, {model['name']} batch {model['batch']}",
                ["run", "peak MiB", "step ms", "overhead"], rows)


# ---- the SVG plot ----

def axis(lo, hi, n=6):
    """(low, high, ticks): [lo, hi] padded by 4%, and round tick values
    (1, 2, 2.5 or 5 times a power of ten apart) inside it."""
    if hi <= lo:
        hi = lo + 1.0
    pad = 0.04 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ticks, v = [], math.ceil(lo / step) * step
    while v <= hi:
        ticks.append(round(v, 10))
        v += step
    return lo, hi, ticks


SERIES = [  # name, colour, marker
    ("frugal planner", "#1f77b4", "circle"),
    ("frugal fixed schedules", "#d62728", "square"),
    ("PyTorch checkpoint_sequential", "#2ca02c", "triangle"),
]


def frontier(points):
    """The points no other point beats on both peak and overhead, by peak:
    the fastest run that fits each memory, which the lines join."""
    out = []
    for x, y, label in sorted(points, key=lambda p: (p[0], p[1])):
        if not out or y < out[-1][1]:
            out.append((x, y, label))
    return out


def marker(kind, x, y, colour):
    if kind == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>'
    if kind == "square":
        return f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{colour}"/>'
    return (f'<polygon points="{x:.1f},{y - 5:.1f} {x - 5:.1f},{y + 4:.1f} {x + 5:.1f},{y + 4:.1f}" '
            f'fill="{colour}"/>')


def svg(data, date):
    model, fixed, plain, _, t_plain, t_ckpt = summarise(data)
    pts = [[], [], []]  # per series: (MiB, overhead %, label)
    for p in data.get(("P", "plan"), []):
        pts[0].append((mib(p["peak"]), pct(p["ms"], plain["ms"]), ""))
    for s, r in fixed.items():
        pts[1].append((mib(r["peak"]), pct(r["ms"], plain["ms"]), s))
    if t_plain:
        pts[2].append((mib(t_plain["peak"]), 0.0, "plain"))
        for r in t_ckpt:
            pts[2].append((mib(r["peak"]), pct(r["ms"], t_plain["ms"]), f"K={r['k']}"))
    every = [p for s in pts for p in s]
    x0, x1, xt = axis(0.0, max(x for x, _, _ in every))
    x0 = 0.0  # memory from zero
    y0, y1, yt = axis(min(0.0, min(y for _, y, _ in every)), max(1.0, max(y for _, y, _ in every)))
    w, h, left, right, top, bottom = 860, 540, 70, 230, 60, 55
    pw, ph = w - left - right, h - top - bottom

    def px(x):
        return left + (x - x0) / (x1 - x0) * pw

    def py(y):
        return top + ph - (y - y0) / (y1 - y0) * ph

    t_model = (data.get(("T", "model")) or [None])[-1]
    threads = f"{model['threads']} threads" + (f" (PyTorch {t_model['threads']})" if t_model else "")
    title = (f"{model['name']} batch {model['batch']}: step-time overhead against peak memory, "
             f"{threads}")
    sub = (f"{date}; load average frugal {load_text(data.get(('P', 'load')))}, PyTorch "
           f"{load_text(data.get(('T', 'load')))}; overhead over each side's plain step")
    e = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="22" font-size="15">{e(title)}</text>',
           f'<text x="{left}" y="40" fill="#555">{e(sub)}</text>']
    for x in xt:
        out.append(f'<line x1="{px(x):.1f}" y1="{top}" x2="{px(x):.1f}" y2="{top + ph}" stroke="#eee"/>')
        out.append(f'<text x="{px(x):.1f}" y="{top + ph + 18}" text-anchor="middle">{x:g}</text>')
    for y in yt:
        out.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + pw}" y2="{py(y):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{h - 12}" text-anchor="middle">'
               'peak memory of the step, MiB (frugal: ledger; PyTorch: heap, see RESULTS.md)</text>')
    out.append(f'<text transform="translate(18 {top + ph / 2:.1f}) rotate(-90)" '
               'text-anchor="middle">step-time overhead over plain, %</text>')
    for (name, colour, kind), series in zip(SERIES, pts):
        ordered = sorted(series)
        front = frontier(ordered)
        if len(front) > 1 and kind != "square":
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in front)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.2"/>')
        for i, (x, y, label) in enumerate(ordered):
            out.append(marker(kind, px(x), py(y), colour))
            if label and kind == "square":
                # staggered: fixed schedules often lie close together
                out.append(f'<text x="{px(x) + 7:.1f}" y="{py(y) - 6 - 11 * (i % 3):.1f}" '
                           f'font-size="10" fill="{colour}">{e(label)}</text>')
    for i, (name, colour, kind) in enumerate(SERIES):
        y = top + 14 + 20 * i
        out.append(marker(kind, left + pw + 20, y, colour))
        out.append(f'<text x="{left + pw + 32}" y="{y + 4}">{e(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+", help="files of P and T records")
    ap.add_argument("--svg", help="write the plot here")
    ap.add_argument("--date", help="the date in the plot's title (default: today, UTC)")
    args = ap.parse_args()
    try:
        data = parse(args.records)
        for n in data["notes"]:
            print(n)
        print()
        budget_table(data)
        runs_table(data)
        if args.svg:
            date = args.date or datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
            text = svg(data, date)
            with open(args.svg, "w") as f:
                f.write(text)
            print(f"planner plot: {args.svg}")
    except RecordError as e:
        print(f"planner_join: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"planner_join: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
