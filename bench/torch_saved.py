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
"""
import argparse
import os
import statistics
import sys
import time


def parse_params(text):
    return dict(item.partition("=")[::2] for item in text.split())


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", help="output of `bench_models --list`, or - for stdin")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, help="timed steps (default: each case's steps=)")
    args = ap.parse_args()

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
    lines = sys.stdin if args.cases == "-" else open(args.cases)
    failed = 0
    for line in lines:
        f = line.rstrip("\n").split("\t")
        if f[0] != "C" or f[1] != "models" or len(f) < 5:
            continue
        name, p = f[2], parse_params(f[4])
        n, c, s, k = (int(p[key]) for key in ("batch", "in_channels", "size", "classes"))
        steps = args.steps or int(p.get("steps", 3))
        try:
            model = torch_models.build(name, c, k).train()
            x = torch.randn(n, c, s, s)
            y = torch.randint(0, k, (n,))
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            saved = saved_bytes(torch, model, opt, x, y)
            median, best = step_times(torch, model, opt, x, y, steps)
        except Exception as e:  # report and keep going, as bench_models does
            print(f"# torch: {name} failed: {type(e).__name__}: {e}")
            failed += 1
            continue
        held = saved["parameter"] + saved["input"]
        records = [("saved_act", saved["activation"]), ("saved_held", held),
                   ("saved_params", saved["parameter"]), ("saved_input", saved["input"]),
                   ("saved_all", saved["activation"] + held)]
        for metric, value in records:
            print(f"M\t{name}\tpytorch\ttorch\t{metric}\t{value}")
        print(f"M\t{name}\tpytorch\ttorch\tstep_ms\t{median:.3f}\t{best:.3f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
