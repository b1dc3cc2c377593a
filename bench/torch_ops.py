"""torch_ops.py: the PyTorch side of bench/bench_ops.c.

Reads the cases that `bench_ops --list` printed (a file, or - for stdin),
times each with PyTorch on the CPU in the same way as the C side (one warm-up
call, a calibration run, then the median of --reps repetitions that each last
at least --min-rep-ms), and prints `R` records in the same tab-separated
format, with impl "torch". Sections it has no baseline for are skipped with a
note. Exits 3 when torch cannot be imported, after printing why.

    bench_ops --list > cases.tsv
    /usr/bin/python3 bench/torch_ops.py cases.tsv --threads 2
"""
import argparse
import os
import statistics
import sys
import time


def parse_params(text):
    out = {}
    for item in text.split():
        key, _, value = item.partition("=")
        out[key] = value
    return out


def time_call(fn, reps, min_rep_ms):
    """(median, fastest) milliseconds per call, as calibrate and time_impls
    in bench_ops.c do it."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = (time.perf_counter() - t0) * 1e3
    iters = 1 if one >= min_rep_ms else -(-min_rep_ms // max(one, 1e-3))
    if iters > 1:
        t0 = time.perf_counter()
        for _ in range(int(iters)):
            fn()
        per = (time.perf_counter() - t0) * 1e3 / iters
        iters = 1 if per >= min_rep_ms else -(-min_rep_ms // max(per, 1e-3))
    iters = int(iters)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) * 1e3 / iters)
    return statistics.median(samples), min(samples)


def uniform(torch, *shape):
    # Same range as the C side's inputs: [-1, 1).
    return torch.rand(*shape) * 2 - 1


def gemm_call(torch, p):
    m, n, k = int(p["m"]), int(p["n"]), int(p["k"])
    # A transposed view is what fr_gemm_out's trans flags mean; torch.mm hands
    # the stride to BLAS as a transpose, without a copy.
    a = uniform(torch, k, m).t() if p["ta"] == "1" else uniform(torch, m, k)
    b = uniform(torch, n, k).t() if p["tb"] == "1" else uniform(torch, k, n)
    c = torch.empty(m, n)
    return lambda: torch.mm(a, b, out=c)


def conv_call(torch, p):
    n, c, h, w = (int(p[key]) for key in ("n", "c", "h", "w"))
    k, r, s = (int(p[key]) for key in ("k", "r", "s"))
    stride, pad = int(p["stride"]), int(p["pad"])
    groups, transposed = int(p.get("groups", 1)), p.get("transposed", "0") == "1"
    x = uniform(torch, n, c, h, w)
    # a transposed case: x (N, Cin = c, H, W), weight (Cin, Cout/groups, R, S)
    wt = uniform(torch, c, k // groups, r, s) if transposed else uniform(torch, k, c // groups, r, s)
    if transposed:
        y = torch.nn.functional.conv_transpose2d(x, wt, None, stride, pad, groups=groups)
    else:
        y = torch.nn.functional.conv2d(x, wt, None, stride, pad, groups=groups)
    dy = uniform(torch, *y.shape)
    conv = torch.ops.aten.convolution
    bwd = torch.ops.aten.convolution_backward
    # The aten ops that autograd itself calls, without the graph bookkeeping,
    # so both sides time the same work: the output mask asks for
    # (dx, dw, db); no bias, like frugal's call.
    args = ([stride, stride], [pad, pad], [1, 1], transposed, [0, 0], groups)

    def fwd():
        return conv(x, wt, None, *args)

    def bwd_data():
        return bwd(dy, x, wt, None, *args, [True, False, False])

    def bwd_weight():
        return bwd(dy, x, wt, None, *args, [False, True, False])

    def every():
        fwd()
        return bwd(dy, x, wt, None, *args, [True, True, False])

    return {"fwd": fwd, "bwd_data": bwd_data, "bwd_weight": bwd_weight, "all": every}[p["pass"]]


def bnact_call(torch, p):
    """y = relu(batch_norm(x) + r) in training mode and its backward (dx,
    dgamma, dbeta and the residual's gradient), through the aten ops that
    autograd calls: native_batch_norm, add_, relu_; threshold_backward,
    native_batch_norm_backward."""
    n, c, h, w = (int(p[key]) for key in ("n", "c", "h", "w"))
    x, r, dy = (uniform(torch, n, c, h, w) for _ in range(3))
    gamma, beta = uniform(torch, c), uniform(torch, c)
    aten = torch.ops.aten

    def fwd():
        y, mean, invstd = aten.native_batch_norm(x, gamma, beta, None, None, True, 0.1, 1e-5)
        return y.add_(r).relu_(), mean, invstd

    y, mean, invstd = fwd()

    def bwd():
        dz = aten.threshold_backward(dy, y, 0)
        return aten.native_batch_norm_backward(dz, x, gamma, None, None, mean, invstd, True, 1e-5,
                                               [True, True, True])

    return {"fwd": fwd, "bwd": bwd}[p["pass"]]


CALLS = {"gemm": gemm_call, "conv": conv_call, "bnact": bnact_call}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", help="output of `bench_ops --list`, or - for stdin")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--min-rep-ms", type=float, default=20.0)
    ap.add_argument("--only", help="run one section")
    args = ap.parse_args()

    try:
        import torch
    except Exception as e:  # any import failure means: no baseline
        print(f"# torch: unavailable ({type(e).__name__}: {e}); no torch column")
        return 3
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    blas = next((part.split("=", 1)[1] for part in torch.__config__.show().replace(",", "\n").split()
                 if part.startswith("BLAS_INFO=")), "?")
    print(f"# torch {torch.__version__}: {torch.get_num_threads()} threads (set_num_threads), "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"mkldnn {'on' if torch.backends.mkldnn.is_available() else 'off'}, BLAS_INFO={blas}")

    lines = sys.stdin if args.cases == "-" else open(args.cases)
    skipped = set()
    with torch.no_grad():
        for line in lines:
            f = line.rstrip("\n").split("\t")
            if f[0] != "C" or len(f) < 5 or (args.only and f[1] != args.only):
                continue
            section, name, work, params = f[1], f[2], f[3], parse_params(f[4])
            make = CALLS.get(section)
            if make is None:
                if section not in skipped:
                    print(f"# torch: no baseline for section {section}")
                    skipped.add(section)
                continue
            try:
                ms, best = time_call(make(torch, params), args.reps, args.min_rep_ms)
            except Exception as e:  # report and keep going, as bench_ops does
                print(f"# torch: {section} / {name} failed: {type(e).__name__}: {e}")
                continue
            print(f"R\t{section}\t{name}\ttorch\t{ms:.6f}\t{work}\t{best:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
