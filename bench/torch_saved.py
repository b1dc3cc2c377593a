"""torch_saved.py: the PyTorch side of bench/bench_models.c.

Reads the model cases that `bench_models --list` printed, builds each model
with bench/torch_models.py, and measures on the CPU:

- what autograd saves in one training forward (the loss included): every
  tensor handed to the pack hook of torch.autograd.graph.saved_tensors_hooks,
  counted by its storage (untyped storage data_ptr, nbytes once), because
  several saved tensors can share a storage (an inplace ReLU saves its
  output, which is BN's output) and one storage can be saved by several ops
  (a convolution and the ReLU before it). Each storage is classed as
  parameter or buffer (its data_ptr is one of the module's), input (the
  images or labels) or activation (anything else);
- the step time: zero_grad(set_to_none), forward, cross-entropy, backward,
  SGD step (momentum 0.9); median and fastest of the timed steps, which
  follow the measured step above (it is the warm-up step: it creates the
  momentum buffers).

Prints `M` records in bench_models.c's format with strategy "pytorch" and
impl "torch". Exits 3 when torch cannot be imported, after printing why.

    bench_models --list > models.tsv
    /usr/bin/python3 bench/torch_saved.py models.tsv --threads 2

With --gpu, the PyTorch side of the GPU section (`bench_models --gpu`): reads
the `C gpu` cases of `bench_models --gpu --list` and trains each model on the
CUDA device, eager, f32 (TF32 off, as frugal's CUDA path has none),
torch.backends.cudnn.benchmark = True, under each strategy PyTorch has
natively (torch_models.native_strategies: plain, and checkpoint or the
memory-efficient DenseNet), with a fresh model and an emptied cache each:
the case's warm-up steps, then torch.cuda.synchronize(),
torch.cuda.reset_peak_memory_stats(), the timed steps, synchronize again.
Prints `G model strategy torch metric value` records: images_per_s,
step_ms, peak_bytes (torch.cuda.max_memory_allocated()), reserved_bytes
(max_memory_reserved()), device_mallocs (the growth of memory_stats()'s
"segment.all.allocated", the caching allocator's cudaMalloc calls, over the
timed steps). Exits 3, after one `#` line saying why, when torch cannot be
imported or sees no CUDA device.

    bench_models --gpu --list > gpu.tsv
    python3 bench/torch_saved.py gpu.tsv --gpu
"""
import argparse
import os
import statistics
import sys
import time


def parse_params(text):
    return dict(item.partition("=")[::2] for item in text.split())


def read_cases(path, section):
    """(name, batch, in_channels, size, classes, params) of each `C section`
    line of a `bench_models --list` output (path, or - for stdin)."""
    lines = sys.stdin if path == "-" else open(path)
    for line in lines:
        f = line.rstrip("\n").split("\t")
        if f[0] != "C" or len(f) < 5 or f[1] != section:
            continue
        p = parse_params(f[4])
        yield (f[2],) + tuple(int(p[key]) for key in ("batch", "in_channels", "size", "classes")) + (p,)


def storage_of(t):
    # torch >= 2.0 has untyped_storage(); 1.13 (Debian's) has _storage().
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t._storage()


def saved_bytes(torch, model, opt, x, y):
    """Bytes of the unique storages autograd saves in one forward + loss, by
    class: {"activation": b, "parameter": b, "input": b}. The step is then
    completed (backward, SGD step): it is also the warm-up step that creates
    the momentum buffers, as on the C side."""
    F = torch.nn.functional
    params = {storage_of(p).data_ptr() for p in model.parameters()}
    params |= {storage_of(b).data_ptr() for b in model.buffers()}
    inputs = {storage_of(x).data_ptr(), storage_of(y).data_ptr()}
    seen = {}

    def pack(t):
        s = storage_of(t)
        ptr = s.data_ptr()
        # nbytes 0: an empty placeholder (undefined or zero-size), no memory.
        if s.nbytes() and ptr not in seen:
            kind = "parameter" if ptr in params else "input" if ptr in inputs else "activation"
            seen[ptr] = (s.nbytes(), kind)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x), y)
    # The hooks hold every saved tensor until backward, so no storage counted
    # above was freed and its address reused by a later one.
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    out = {"activation": 0, "parameter": 0, "input": 0}
    for nbytes, kind in seen.values():
        out[kind] += nbytes
    return out


def train_flops(torch, model, x):
    """The floating-point work of one training step, for GFLOP/s: 3 x the
    forward's convolution and linear multiply-adds x 2 (forward, gradient of
    the input, gradient of the weight: one product each), counted by forward
    hooks from the output shapes. Batch norm, ReLU, pooling and the optimizer
    are left out (a few percent), and so is what a strategy recomputes: the
    same figure serves every strategy, so GFLOP/s compares useful work."""
    macs = [0]

    def hook(mod, inputs, out):
        if isinstance(mod, torch.nn.Conv2d):
            per_out = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
        else:
            per_out = mod.in_features
        macs[0] += out.numel() * per_out

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return 3 * 2 * macs[0]


def step_times(torch, model, opt, x, y, steps):
    """(median, fastest) ms of `steps` training steps, after saved_bytes' step."""
    F = torch.nn.functional

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


# frugal's mixed-precision rows ("plain@bf16", "plain@f16") against
# PyTorch's autocast: the same model eager under torch.autocast, f16 with a
# GradScaler (frugal's f16 rows run its dynamic loss scaler).
GPU_MIXED = {"plain@bf16": "bfloat16", "plain@f16": "float16"}


def gpu_step(torch, model, opt, x, y, amp=None, scaler=None):
    opt.zero_grad(set_to_none=True)
    if amp is None:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        return
    with torch.autocast("cuda", dtype=amp):
        logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.float(), y)
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def gpu_measure(torch, model, opt, x, y, warmup, steps, amp=None):
    """The GPU section's figures for one model under one strategy (and
    autocast dtype `amp`, or None for f32)."""
    scaler = torch.cuda.amp.GradScaler() if amp == torch.float16 else None

    def one_step():
        gpu_step(torch, model, opt, x, y, amp, scaler)

    for _ in range(warmup):
        one_step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats().get("segment.all.allocated", 0)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step()
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    stats = torch.cuda.memory_stats()
    return {"images_per_s": x.shape[0] * steps / secs, "step_ms": secs * 1e3 / steps,
            "peak_bytes": torch.cuda.max_memory_allocated(),
            "reserved_bytes": torch.cuda.max_memory_reserved(),
            "device_mallocs": stats.get("segment.all.allocated", 0) - before}


def gpu_main(args):
    try:
        import torch
    except Exception as e:  # any import failure means: no baseline
        print(f"# torch gpu: unavailable ({type(e).__name__}: {e}); no torch columns")
        return 3
    if not torch.cuda.is_available():
        why = "a CPU-only build" if torch.version.cuda is None else "no device visible"
        print(f"# torch gpu: torch {torch.__version__} has no CUDA device "
              f"(torch.cuda.is_available() is False: {why}); no torch columns")
        return 3
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_models

    torch.backends.cudnn.benchmark = True
    # frugal's CUDA convolutions and GEMMs are plain FP32 (cuda/conv_cudnn.cu,
    # cuda/device.cu); PyTorch's cuDNN would use TF32 on Ampere and later.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    print(f"# torch gpu: torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}, {torch.cuda.get_device_name(dev)}; eager, f32, "
          "TF32 off, cudnn.benchmark on")
    failed = 0
    for name, n, c, s, k, p in read_cases(args.cases, "gpu"):
        warmup = int(p.get("warmup", 3))
        steps = args.steps or int(p.get("steps", 10))
        for strategy in list(torch_models.native_strategies(name)) + list(GPU_MIXED):
            t0 = time.perf_counter()
            try:
                torch.manual_seed(0)
                base = strategy.split("@")[0]
                amp = getattr(torch, GPU_MIXED[strategy]) if strategy in GPU_MIXED else None
                model = torch_models.build(name, c, k, base).to(dev).train()
                x = torch.randn(n, c, s, s, device=dev)
                y = torch.randint(0, k, (n,), device=dev)
                opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
                figures = gpu_measure(torch, model, opt, x, y, warmup, steps, amp)
            except Exception as e:  # report and keep going, as bench_models does
                print(f"# torch gpu: {name} / {strategy} failed: {type(e).__name__}: {e}")
                failed += 1
                figures = None
            model = opt = x = y = None
            torch.cuda.empty_cache()
            for metric, value in (figures or {}).items():
                text = str(value) if isinstance(value, int) else f"{value:.3f}"
                print(f"G\t{name}\t{strategy}\ttorch\t{metric}\t{text}")
            sys.stdout.flush()
            print(f"torch_saved: gpu {name} {strategy} took {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", help="output of `bench_models --list`, or - for stdin")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, help="timed steps (default: each case's steps=)")
    ap.add_argument("--gpu", action="store_true",
                    help="the GPU section: read `bench_models --gpu --list` cases, train on CUDA")
    args = ap.parse_args()
    if args.gpu:
        return gpu_main(args)

    try:
        import torch
    except Exception as e:  # any import failure means: no baseline
        print(f"# torch: unavailable ({type(e).__name__}: {e}); no torch column")
        return 3
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_models

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"# torch models: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"mkldnn {'on' if torch.backends.mkldnn.is_available() else 'off'}")
    failed = 0
    for name, n, c, s, k, p in read_cases(args.cases, "models"):
        steps = args.steps or int(p.get("steps", 3))
        try:
            model = torch_models.build(name, c, k).train()
            x = torch.randn(n, c, s, s)
            y = torch.randint(0, k, (n,))
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            flops = train_flops(torch, model, x)
            saved = saved_bytes(torch, model, opt, x, y)
            median, best = step_times(torch, model, opt, x, y, steps)
        except Exception as e:  # report and keep going, as bench_models does
            print(f"# torch: {name} failed: {type(e).__name__}: {e}")
            failed += 1
            continue
        held = saved["parameter"] + saved["input"]
        records = [("train_flops", flops), ("saved_act", saved["activation"]), ("saved_held", held),
                   ("saved_params", saved["parameter"]), ("saved_input", saved["input"]),
                   ("saved_all", saved["activation"] + held)]
        for metric, value in records:
            print(f"M\t{name}\tpytorch\ttorch\t{metric}\t{value}")
        print(f"M\t{name}\tpytorch\ttorch\tstep_ms\t{median:.3f}\t{best:.3f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
