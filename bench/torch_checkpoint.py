"""torch_checkpoint.py: PyTorch's torch.utils.checkpoint.checkpoint_sequential
on the planner bench's model: step time and peak memory for every number of
segments, the PyTorch side of bench/bench_planner.c (bench/planner_join.py
puts them side by side).

    torch_checkpoint.py --shim build/bench/peak_alloc.so [--model resnet56]
        [--batch 64] [--steps 3] [--threads 2] [--segments 2,5,29]

The model is bench/torch_models.py's ResNet (the architecture of
models/resnet.h) laid out as one flat nn.Sequential: the stem (conv, BN, ReLU),
each basic block, then the head (average pool, flatten, fc) -- 3(D-2)/6 + 2
modules for ResNet-D, 29 for ResNet-56. A step is what bench_planner times:
zero_grad(set_to_none=True), forward, cross-entropy, backward, SGD step
(lr 0.01, momentum 0.9), on a random normal batch (N, 3, 32, 32) with random
labels. First the plain step (the Sequential called directly), then
checkpoint_sequential(model, K, x) for each K (default 2 to the number of
modules; K = 1 checkpoints nothing). Each gets one warm-up step, then
--steps timed steps: the median ms.

Peak memory: CPU PyTorch has no max_memory_allocated, so the script runs
under bench/peak_alloc.c (LD_PRELOAD; the script re-executes itself with it
when it is not loaded yet), which counts the heap bytes in use
(malloc_usable_size of every live block). For each timed step

    peak = (heap peak during the step - heap in use just before it)
           + bytes of the parameters, the momentum buffers and the batch

taken over the timed steps (their largest). The gradients of the previous
step are released before the "just before" reading, so everything the step
allocates (activations, gradients, autograd and oneDNN temporaries, Python
objects) is in the first term; the second adds what is alive across steps
and frugal's ledger counts as well (fr_mem_total_peak: parameters,
optimizer state, the batch). BN running statistics (a few KiB) are in
neither term. At start the shim is checked: allocating a 100 MiB tensor must
move its count by 100 MiB (+-1 MiB).

PyTorch 1.13's checkpoint_sequential takes no use_reentrant and uses the
reentrant checkpoint, which gives the weights of a checkpointed segment
gradients only when the segment's input requires grad: the batch is marked
requires_grad_() in the checkpointed runs (its gradient, one batch of
floats, is then computed and counted), and after the warm-up step every
parameter is asserted to have a gradient.

Records (tab-separated; "#" lines are notes):
    T  model  NAME  BATCH  MODULES  STEPS  THREADS
    T  load   before|after  L1  L5  L15
    T  plain  PEAK_BYTES  MEDIAN_MS
    T  ckpt   K  PEAK_BYTES  MEDIAN_MS
Exit status 3 when torch cannot be imported, 2 for bad arguments or a shim
that does not count, 1 when a run failed.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20


def segments_arg(text):
    try:
        ks = [int(k) for k in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers")
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each K must be >= 1")
    return ks


def positive(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return v


def shim_functions():
    """The shim's counters when it is loaded into this process, else None."""
    lib = ctypes.CDLL(None)
    try:
        cur, peak, reset = lib.peak_alloc_current, lib.peak_alloc_peak, lib.peak_alloc_reset
    except AttributeError:
        return None
    cur.restype = peak.restype = ctypes.c_int64
    cur.argtypes = peak.argtypes = reset.argtypes = []
    reset.restype = None
    return cur, peak, reset


def flat_resnet(torch_models, name):
    """The ResNet of torch_models as one nn.Sequential of stem, blocks, head."""
    nn = torch_models.nn
    net = torch_models.build(name, 3, 10)
    if not hasattr(net, "layer3") or getattr(net, "preact", False):
        raise ValueError(f"{name!r} is not a basic-block ResNet")
    parts = [nn.Sequential(net.conv1, net.bn1, net.relu)]
    parts += list(net.layer1) + list(net.layer2) + list(net.layer3)
    parts.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), net.fc))
    return nn.Sequential(*parts)


def load(when):
    l1, l5, l15 = os.getloadavg()
    print(f"T\tload\t{when}\t{l1:.2f}\t{l5:.2f}\t{l15:.2f}", flush=True)


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(torch, model, opt, x, y, steps, shim, segments=None):
    """(peak bytes, median ms) of `steps` timed steps after one warm-up."""
    F = torch.nn.functional
    cur, peak, reset = shim
    from torch.utils.checkpoint import checkpoint_sequential

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(x) if segments is None else checkpoint_sequential(model, segments, x)
        F.cross_entropy(out, y).backward()
        opt.step()

    opt.zero_grad(set_to_none=True)
    x.grad = None
    step()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"checkpoint_sequential K={segments}: no gradient for {missing[:3]}..."
    state = [b for s in opt.state.values() for b in s.values() if torch.is_tensor(b)]
    held = tensor_bytes(list(model.parameters()) + state + [x, y])
    peaks, times = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        x.grad = None
        before = cur()
        reset()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
        peaks.append(peak() - before + held)
    return max(peaks), statistics.median(times)


def check_shim(torch, shim):
    """The 100 MiB check; returns how far the count moved, in bytes."""
    cur, _, _ = shim
    before = cur()
    t = torch.empty(100 * MIB, dtype=torch.uint8)
    t.fill_(1)
    moved = cur() - before
    del t
    if abs(moved - 100 * MIB) > MIB:
        raise RuntimeError(f"peak_alloc shim: a 100 MiB tensor moved the count by {moved / MIB:.2f} MiB")
    return moved


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shim", required=True, help="bench/peak_alloc.c built as a .so (make bench)")
    ap.add_argument("--model", default="resnet56")
    ap.add_argument("--batch", type=positive, default=64)
    ap.add_argument("--steps", type=positive, default=3)
    ap.add_argument("--threads", type=positive, default=2)
    ap.add_argument("--segments", type=segments_arg,
                    help="comma-separated K for checkpoint_sequential (default 2 to the module count)")
    args = ap.parse_args()

    shim = shim_functions()
    if shim is None:
        path = os.path.abspath(args.shim)
        if not os.path.isfile(path):
            print(f"torch_checkpoint: --shim {args.shim}: no such file (build it with make bench)",
                  file=sys.stderr)
            return 2
        if os.environ.get("PEAK_ALLOC_REEXEC") == path:
            print(f"torch_checkpoint: {path} was preloaded but its counters are not visible",
                  file=sys.stderr)
            return 2
        env = dict(os.environ, PEAK_ALLOC_REEXEC=path)
        env["LD_PRELOAD"] = " ".join(filter(None, [path, os.environ.get("LD_PRELOAD")]))
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable] + sys.argv, env)

    try:
        import torch
    except Exception as e:  # any import failure means: no baseline
        print(f"# torch: unavailable ({type(e).__name__}: {e}); no PyTorch points")
        return 3
    sys.path.insert(0, HERE)
    import torch_models

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    try:
        moved = check_shim(torch, shim)
        model = flat_resnet(torch_models, args.model).train()
    except (RuntimeError, ValueError) as e:
        print(f"torch_checkpoint: {e}", file=sys.stderr)
        return 2
    n_mod = len(model)
    ks = args.segments or list(range(2, n_mod + 1))
    bad = [k for k in ks if k > n_mod]
    if bad:
        print(f"torch_checkpoint: --segments {bad[0]}: the model has only {n_mod} modules",
              file=sys.stderr)
        return 2
    x = torch.randn(args.batch, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    print(f"# torch checkpoint: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"mkldnn {'on' if torch.backends.mkldnn.is_available() else 'off'}; peak-alloc shim: "
          f"a 100 MiB tensor moved its count by {moved / MIB:.3f} MiB")
    print(f"T\tmodel\t{args.model}\t{args.batch}\t{n_mod}\t{args.steps}\t{torch.get_num_threads()}",
          flush=True)
    load("before")
    failed = 0
    for k in [None] + ks:
        # The reentrant checkpoint gives a segment's weights gradients only
        # when its input requires grad.
        x.requires_grad_(k is not None)
        try:
            peak, ms = measure(torch, model, opt, x, y, args.steps, shim, k)
        except (RuntimeError, AssertionError) as e:
            print(f"# torch checkpoint: K={k} failed: {type(e).__name__}: {e}")
            failed += 1
            continue
        print(f"T\tplain\t{peak}\t{ms:.3f}" if k is None else f"T\tckpt\t{k}\t{peak}\t{ms:.3f}",
              flush=True)
    load("after")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
