"""join.py: joins the records of bench_ops and torch_ops.py into tables.

Reads the tab-separated records (see bench/bench_ops.c) from the files named
on the command line, in order, and prints the notes, then one Markdown table
per section: a row per case, a column per implementation with frugal first,
the ratio of each other implementation to frugal (> 1: frugal is faster or
smaller), and the rates (GFLOP/s) when the section's unit is ms and the case
has a work count. Under each table, the geometric mean of each ratio.

A (case, impl) measured more than once (run.sh's rounds) keeps its lowest
value: on shared cores, other work only ever adds time. Notes repeated by
every round are printed once. A value whose median lies more than NOISY
above its fastest repetition is marked `~`: something else was running.

Generic on purpose: a new section or implementation needs no change here.

The models section (bench_models.c's and torch_saved.py's M records) has a
table of its own per model: a row per memory strategy with saved bytes and
step time as ratios to PyTorch, and the issue's targets beside them.

The GPU section (`bench_models --gpu` and `torch_saved.py --gpu`, G records)
has one table for all models: a row per (model, frugal strategy) with
images/s and the CUDA peak as ratios to PyTorch's plain training, the
issue's target for the row (met / missed) and the cudaMalloc calls of the
timed steps; then a table of PyTorch's own rows (plain and the strategies it
has natively) beside frugal's same strategy.
"""
import math
import sys

SUBJECT = "frugal"
NOISY = 0.3


def print_table(title, head, rows, left=1):
    """A Markdown table under a '## title' heading: the first `left` columns
    left-aligned, the others right-aligned, each as wide as its widest cell."""
    widths = [max(len(r[c]) for r in [head] + rows) for c in range(len(head))]

    def line(cells):
        out = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "| " + " | ".join(out) + " |"

    print(f"## {title}")
    print()
    print(line(head))
    rule = ["-" * (w + 2) if c < left else "-" * (w + 1) + ":" for c, w in enumerate(widths)]
    print("|" + "|".join(rule) + "|")
    for r in rows:
        print(line(r))
    print()


def fmt(value, digits=3):
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.{digits}f}"


def read(paths):
    notes, sections, order = [], {}, []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.rstrip("\n")
                fields = line.split("\t")
                if line.startswith("#"):
                    if line not in notes:
                        notes.append(line)
                elif fields[0] == "S" and len(fields) >= 4:
                    if fields[1] not in sections:
                        sections[fields[1]] = {"title": fields[2], "unit": fields[3], "cases": [],
                                               "impls": [], "value": {}, "best": {}, "work": {}}
                        order.append(fields[1])
                elif fields[0] == "R" and len(fields) >= 6:
                    _, sec, case, impl, value, work = fields[:6]
                    best = float(fields[6]) if len(fields) >= 7 else None
                    s = sections.setdefault(sec, {"title": sec, "unit": "ms", "cases": [], "impls": [],
                                                  "value": {}, "best": {}, "work": {}})
                    if sec not in order:
                        order.append(sec)
                    if case not in s["cases"]:
                        s["cases"].append(case)
                    if impl not in s["impls"]:
                        s["impls"].append(impl)
                    old = s["value"].get((case, impl))
                    if old is None or float(value) < old:
                        s["value"][case, impl] = float(value)
                        s["best"][case, impl] = best
                    s["work"][case] = float(work)
    return notes, sections, order


def table(name, s):
    impls = sorted(s["impls"], key=lambda i: (i != SUBJECT, s["impls"].index(i)))
    others = [i for i in impls if i != SUBJECT] if SUBJECT in impls else []
    unit = s["unit"]
    rates = unit == "ms" and any(w > 0 for w in s["work"].values())
    head = ["case"] + [f"{i} {unit}" for i in impls] + [f"{o}/{SUBJECT}" for o in others]
    if rates:
        head += [f"{i} GFLOP/s" for i in impls]
    rows, ratios, noisy = [], {o: [] for o in others}, 0

    def cell(case, impl):
        nonlocal noisy
        v, best = s["value"].get((case, impl)), s["best"].get((case, impl))
        if v is not None and best and v > best * (1 + NOISY):
            noisy += 1
            return "~" + fmt(v)
        return fmt(v)

    for case in s["cases"]:
        vals = [s["value"].get((case, i)) for i in impls]
        row = [case] + [cell(case, i) for i in impls]
        base = s["value"].get((case, SUBJECT))
        for o in others:
            v = s["value"].get((case, o))
            r = v / base if v is not None and base else None
            if r is not None:
                ratios[o].append(r)
            row.append(fmt(r, 2))
        if rates:
            work = s["work"].get(case, 0)
            row += [fmt(work / (v * 1e6), 1) if v and work else "-" for v in vals]
        rows.append(row)
    print_table(f"{name}: {s['title']}", head, rows)
    for o in others:
        if ratios[o]:
            g = math.exp(sum(math.log(r) for r in ratios[o]) / len(ratios[o]))
            print(f"geometric mean {o}/{SUBJECT}: {g:.2f} over {len(ratios[o])} cases")
        else:
            print(f"{o}: no results for this section")
    if others:
        better = "is faster" if unit == "ms" else "uses less"
        print(f"(ratio = other {unit} / {SUBJECT} {unit}: > 1 means {SUBJECT} {better})")
    if noisy:
        print(f"~ on {noisy} values: the median is over {NOISY:.0%} above the fastest repetition "
              "(other work on the machine); rerun when it is quiet")
    print()


# ---- the models section (bench_models.c, torch_saved.py) ----
#
# Records: "MS model title" and "M model strategy impl metric value [best]".
# One table per model: a row for PyTorch's reference (strategy "pytorch"),
# then one per frugal strategy, with ratios to PyTorch and the targets.

MIB = 1024.0 * 1024.0
TORCH_ROW = "pytorch"


def fmt_mib(nbytes):
    return "-" if nbytes is None else f"{nbytes / MIB:.1f}"

# The targets for saved activations, frugal / PyTorch (activations
# only): (text, lowest, highest); "about 1.0x" reads as within 10%.
SAVED_TARGETS = {
    "resnet56": {"plain": ("~1.0x", 0.90, 1.10), "recompute": ("<=0.80x", None, 0.80),
                 "abn": ("<=0.55x", None, 0.55), "checkpoint": ("<=0.25x", None, 0.25),
                 "abn+checkpoint": ("<=0.15x", None, 0.15)},
    "densenet-bc-100": {"recompute": ("<=0.20x", None, 0.20)},
}
# Step time targets of the CPU issue (issue 11), per model: (text, against,
# highest); against "torch" is PyTorch's step in the same run, "plain"
# frugal's own plain step on the same model. ResNet-20's ">= 1.25x PyTorch's
# images/s" is a step of at most 0.8x PyTorch's.
_STRATEGY_TIME = {"recompute": ("<=1.05x plain", "plain", 1.05),
                  "checkpoint": ("<=1.30x plain", "plain", 1.30)}
TIME_TARGETS = {
    "resnet56": {"plain": ("<=0.80x torch", "torch", 0.80), **_STRATEGY_TIME},
    "resnet20": {"plain": ("<=0.80x torch", "torch", 0.80)},
    "densenet-bc-100": {"plain": ("<=0.50x torch", "torch", 0.50), **_STRATEGY_TIME},
    # issue 21: the MobileNet example's step no slower than the same model in PyTorch
    "mobilenet_se": {"plain": ("<=1.00x torch", "torch", 1.00)},
}


def read_models(paths, title_tag="MS", tag="M"):
    """The models section's records (or, with "GS" and "G", the GPU
    section's): titles, values, best and the models in order."""
    titles, values, best, order = {}, {}, {}, []
    for path in paths:
        with open(path) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                if fields[0] == title_tag and len(fields) >= 3:
                    titles[fields[1]] = fields[2]
                    if fields[1] not in order:
                        order.append(fields[1])
                elif fields[0] == tag and len(fields) >= 6:
                    model, strategy, impl, metric, value = fields[1:6]
                    if model not in order:
                        order.append(model)
                    key = (model, strategy, impl, metric)
                    old = values.get(key)
                    # repeated runs: keep the lowest, as for the op tables
                    if old is None or float(value) < old:
                        values[key] = float(value)
                        best[key] = float(fields[6]) if len(fields) >= 7 else None
    return titles, values, best, order


def check(ratio, target):
    """'text ok' or 'text MISSED' for a ratio against (text, lowest, highest)."""
    text, lo, hi = target
    if ratio is None:
        return f"{text} ?"
    ok = (lo is None or ratio >= lo) and (hi is None or ratio <= hi)
    return f"{text} {'ok' if ok else 'MISSED'}"


def models_table(model, title, values, best):
    strategies = []
    for (m, strategy, impl, _metric) in values:
        if m == model and impl == SUBJECT and strategy not in strategies:
            strategies.append(strategy)

    def get(strategy, metric):
        impl = "torch" if strategy == TORCH_ROW else SUBJECT
        return values.get((model, strategy, impl, metric))

    def ratio(a, b):
        return a / b if a is not None and b else None

    noisy = 0

    def step_cell(strategy):
        # The fastest step (others' work only adds time); ~ when the median
        # of the steps is over NOISY above it.
        nonlocal noisy
        impl = "torch" if strategy == TORCH_ROW else SUBJECT
        fast = best.get((model, strategy, impl, "step_ms"))
        median = get(strategy, "step_ms")
        if fast is None:
            return median, fmt(median)
        if median > fast * (1 + NOISY):
            noisy += 1
            return fast, "~" + fmt(fast)
        return fast, fmt(fast)

    head = ["strategy", "saved act MiB", "act/torch", "act target", "saved all MiB", "all/torch",
            "peak MiB", "step ms", "GFLOP/s", "step/torch", "step/plain", "time target"]
    flops = get(TORCH_ROW, "train_flops")

    def rate(step):
        return fmt(flops / (step * 1e6), 1) if flops and step else "-"

    t_act, t_all = get(TORCH_ROW, "saved_act"), get(TORCH_ROW, "saved_all")
    t_step, _ = step_cell(TORCH_ROW) if get(TORCH_ROW, "step_ms") is not None else (None, "-")
    p_step = step_cell("plain")[0] if get("plain", "step_ms") is not None else None
    rows = []
    if t_act is not None:
        rows.append([f"{TORCH_ROW} (reference)", fmt_mib(t_act), "1.00", "", fmt_mib(t_all), "1.00",
                     "-", step_cell(TORCH_ROW)[1], rate(t_step), "1.00", "", ""])
    for st in strategies:
        act, alls, peak = get(st, "saved_act"), get(st, "saved_all"), get(st, "peak_total")
        step, step_text = step_cell(st) if get(st, "step_ms") is not None else (None, "-")
        r_act = ratio(act, t_act)
        target = SAVED_TARGETS.get(model, {}).get(st)
        time_target = TIME_TARGETS.get(model, {}).get(st)
        if time_target:
            against = t_step if time_target[1] == "torch" else p_step
            time_cell = check(ratio(step, against), (time_target[0], None, time_target[2]))
        else:
            time_cell = ""
        rows.append([st, fmt_mib(act), fmt(r_act, 2), check(r_act, target) if target else "",
                     fmt_mib(alls), fmt(ratio(alls, t_all), 2), fmt_mib(peak), step_text, rate(step),
                     fmt(ratio(step, t_step), 2), fmt(ratio(step, p_step), 2), time_cell])
    print_table(f"models: {title}", head, rows)
    if t_act is None:
        print("(no PyTorch figures for this model: see the # notes)")
    print("ratios here are frugal / other (< 1: frugal keeps less or is faster), the inverse of "
          "the op tables.\nsaved act: activations kept for backward (frugal: peak of the SAVED tag "
          "over a step; PyTorch: unique storages\nsaved in one forward that are neither parameters, "
          "buffers nor the batch); saved all: the same plus the\nparameters, buffers, images and "
          "labels that were saved (bench/README.md has the details).")
    print("step ms: fastest timed step (forward, cross-entropy, backward, SGD momentum step); "
          "peak MiB: frugal's total ledger peak.")
    if flops:
        print(f"GFLOP/s: {flops / 1e9:.2f} GFLOP a step (3 x 2 x the forward's convolution and "
              "linear multiply-adds, PyTorch forward hooks; the same for every strategy, so\n"
              "recomputation lowers it) / step time; the machine's measured peak is the gemm "
              "section's 2048 x 2048 x 2048 sgemm.")
    if noisy:
        print(f"~ on {noisy} step times: the median step is over {NOISY:.0%} above the fastest "
              "(other work on the machine)")
    print()



# ---- the GPU section (bench_models --gpu, torch_saved.py --gpu) ----
#
# Records: "GS model title" and "G model strategy impl metric value".

GPU_REFERENCE = "plain"
# The GPU targets: (what, text, test). "speed" is frugal images/s /
# PyTorch plain images/s (higher is better), "peak" frugal's CUDA peak /
# PyTorch plain's max_memory_allocated (lower is better). A model's own entry
# replaces the common one (DenseNet's recompute is the efficient DenseNet).
GPU_TARGETS = {
    "plain": ("speed", ">= 1.00x", lambda r: r >= 1.00),
    "recompute": ("peak", "<= 0.80x", lambda r: r <= 0.80),
    "abn": ("peak", "<= 0.60x", lambda r: r <= 0.60),
    "checkpoint": ("peak", "<= 0.30x", lambda r: r <= 0.30),
}
GPU_MODEL_TARGETS = {"densenet-bc-100": {"recompute": ("peak", "<= 0.25x", lambda r: r <= 0.25)}}


def gpu_strategy_name(model, strategy):
    if model.startswith("densenet") and strategy == "recompute":
        return "recompute (efficient)"
    return strategy


def gpu_tables(titles, values, models):
    def get(model, strategy, impl, metric):
        return values.get((model, strategy, impl, metric))

    def ratio(a, b):
        return a / b if a is not None and b else None

    def strategies(model, impl):
        out = []
        for (m, st, i, _metric) in values:
            if m == model and i == impl and st not in out:
                out.append(st)
        return out

    head = ["model", "strategy", "frugal img/s", "torch img/s (plain)", "speed frugal/torch",
            "frugal peak MiB", "torch peak MiB (plain)", "peak frugal/torch", "target",
            "cudaMalloc (timed)", "frugal reserved MiB"]
    rows, missed, mallocs = [], 0, 0
    for model in models:
        t_ips = get(model, GPU_REFERENCE, "torch", "images_per_s")
        t_peak = get(model, GPU_REFERENCE, "torch", "peak_bytes")
        for st in strategies(model, SUBJECT):
            ips, peak = get(model, st, SUBJECT, "images_per_s"), get(model, st, SUBJECT, "peak_bytes")
            r_speed, r_peak = ratio(ips, t_ips), ratio(peak, t_peak)
            target = GPU_MODEL_TARGETS.get(model, {}).get(st) or GPU_TARGETS.get(st)
            cell = ""
            if target:
                what, text, test = target
                r = r_speed if what == "speed" else r_peak
                verdict = "?" if r is None else "met" if test(r) else "missed"
                missed += verdict == "missed"
                cell = f"{what} {text}: {verdict}"
            n = get(model, st, SUBJECT, "device_mallocs")
            if n:
                mallocs += 1
            rows.append([model, gpu_strategy_name(model, st), fmt(ips), fmt(t_ips), fmt(r_speed, 2),
                         fmt_mib(peak), fmt_mib(t_peak), fmt(r_peak, 2), cell,
                         "-" if n is None else f"{n:.0f}",
                         fmt_mib(get(model, st, SUBJECT, "reserved_bytes"))])
    print_table("gpu: training on the CUDA device, f32", head, rows, left=2)
    for model in models:
        if model in titles:
            print(f"{model}: {titles[model]}")
    print("speed = frugal images/s / PyTorch plain images/s (> 1: frugal is faster); peak = "
          "frugal's ledger CUDA peak / PyTorch plain's\ntorch.cuda.max_memory_allocated(), both over "
          "the timed steps (< 1: frugal needs less). Targets: plain images/s >= PyTorch;\npeak with "
          "recompute <= 0.80x, abn <= 0.60x, checkpoint <= 0.30x, DenseNet's efficient (recompute) "
          "<= 0.25x. cudaMalloc (timed):\ncalls during the timed steps, target 0 (bench/README.md "
          "has the details).")
    if any(get(m, GPU_REFERENCE, "torch", "images_per_s") is None for m in models):
        print("(no PyTorch figures for some models: see the # notes)")
    if missed:
        print(f"{missed} target(s) missed")
    if mallocs:
        print(f"{mallocs} row(s) called cudaMalloc in the timed steps (target 0)")
    print()

    head = ["model", "strategy", "torch img/s", "torch peak MiB", "torch reserved MiB",
            "torch cudaMalloc (timed)", "speed frugal/torch", "peak frugal/torch"]
    rows = []
    for model in models:
        for st in strategies(model, "torch"):
            ips, peak = get(model, st, "torch", "images_per_s"), get(model, st, "torch", "peak_bytes")
            n = get(model, st, "torch", "device_mallocs")
            rows.append([model, gpu_strategy_name(model, st), fmt(ips), fmt_mib(peak),
                         fmt_mib(get(model, st, "torch", "reserved_bytes")),
                         "-" if n is None else f"{n:.0f}",
                         fmt(ratio(get(model, st, SUBJECT, "images_per_s"), ips), 2),
                         fmt(ratio(get(model, st, SUBJECT, "peak_bytes"), peak), 2)])
    if rows:
        print_table("gpu: PyTorch's own strategies, each against frugal's same strategy", head, rows,
                    left=2)
        print("PyTorch's checkpoint: torch.utils.checkpoint over about sqrt(blocks) equal segments; "
              "its recompute on DenseNet:\ntorchvision's memory-efficient DenseNet (bench/torch_models.py); "
              "plain@bf16 / plain@f16: frugal --precision\nagainst torch.autocast (f16 with GradScaler). "
              "Ratios as above, against PyTorch's row.")
        print()

def main():
    notes, sections, order = read(sys.argv[1:])
    for n in notes:
        print(n)
    print()
    for name in order:
        if sections[name]["cases"]:
            table(name, sections[name])
        else:
            print(f"## {name}: no results\n")
    titles, values, best, models = read_models(sys.argv[1:])
    for model in models:
        models_table(model, titles.get(model, model), values, best)
    # The GPU section runs once: "keep the lowest" never has two values to choose from.
    titles, values, _, models = read_models(sys.argv[1:], "GS", "G")
    if models:
        gpu_tables(titles, values, models)


if __name__ == "__main__":
    main()
