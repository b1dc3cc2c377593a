"""overlap_table.py: one row of the overlap table of `tests/multihost.sh --bench`
from bench_dist's lines (bench/bench_dist.c), overlap off and on, repeated.

    python3 overlap_table.py MODEL LINK BUCKET OFF_LINES_FILE ON_LINES_FILE

Per step, medians over the runs: the step time off and on; the all-reduce
time (the exposed all-reduce with overlap off, where every bucket starts
after the last backward ends, so all of it is exposed); the exposed
all-reduce with overlap on; hidden = all-reduce - exposed on, in ms and as a
share of the all-reduce."""
import re
import statistics
import sys

LINE = re.compile(r"([0-9.]+) ms a step, .*exposed all-reduce ([0-9.]+) ms a step \((\d+) buckets")


def runs(path):
    out = []
    with open(path) as f:
        for line in f:
            m = LINE.search(line)
            if m:
                out.append((float(m.group(1)), float(m.group(2)), int(m.group(3))))
    return out


def main():
    model, link, bucket, off_file, on_file = sys.argv[1:6]
    off, on = runs(off_file), runs(on_file)
    label = bucket if bucket == "default" else bucket + " MiB"
    if not off or not on:
        print(f"| {model} | {link} | {label} | a run failed | | | | |")
        return
    label += f" ({on[0][2]} buckets)"
    step_off = statistics.median(r[0] for r in off)
    step_on = statistics.median(r[0] for r in on)
    reduce_ms = statistics.median(r[1] for r in off)
    exposed_on = statistics.median(r[1] for r in on)
    hidden = reduce_ms - exposed_on
    share = 100 * hidden / reduce_ms if reduce_ms > 0 else 0
    print(f"| {model} | {link} | {label} | {step_off:.0f} | {step_on:.0f} | {reduce_ms:.1f} | "
          f"{exposed_on:.1f} | {hidden:.1f} ({share:.0f}%) |")


main()
