"""The PyTorch baseline of examples/train: the same CIFAR ResNet (He et al. 2016,
option-B projection shortcuts, as models/resnet.h) trained on Fashion-MNIST with
the same optimizer and batch, for a fixed number of steps; prints images/s.

    OMP_NUM_THREADS=2 /usr/bin/python3 bench/torch_train.py --steps 30 --threads 2
    build/examples/train --limit-train 3840 --epochs 1 --threads 2   # same 30 steps, frugal
    OMP_NUM_THREADS=2 /usr/bin/python3 bench/torch_train.py --eval --batch 256 --threads 2
    build/examples/validate --checkpoint CKPT --batch 256 --threads 2  # frugal's eval pass

The first --warmup steps are not timed (allocator and oneDNN warm-up). Data
are read from the IDX .gz files with numpy, normalised like frugal's loader
(mean 0.2860, std 0.3530), no augmentation, shuffled once.
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# The same ResNet module as the fixture generators (models/resnet.h's names).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
from cifar_models import ResNet  # noqa: E402


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--eval", action="store_true",
                    help="instead of training: one eval-mode pass under torch.no_grad over the "
                         "test set at --batch (what examples/validate's eval pass does)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.eval:
        return evaluate(args)
    x = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
    need = (args.steps + args.warmup) * args.batch
    order = np.random.default_rng(0).permutation(len(x))[:need]
    images = (torch.from_numpy(x[order].astype(np.float32) / 255.0).unsqueeze(1) - 0.2860) / 0.3530
    labels = torch.from_numpy(y[order].astype(np.int64))

    model = ResNet(args.depth, 1, 10)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    model.train()
    t0, timed, loss_sum = None, 0, 0.0
    for step in range(args.steps + args.warmup):
        if step == args.warmup:
            t0 = time.perf_counter()
        xb = images[step * args.batch:(step + 1) * args.batch]
        yb = labels[step * args.batch:(step + 1) * args.batch]
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            timed += len(xb)
            loss_sum += loss.item()
    secs = time.perf_counter() - t0
    print(f"torch {torch.__version__} resnet{args.depth} batch {args.batch}, {args.threads} threads: "
          f"{args.steps} steps in {secs:.1f} s, {timed / secs:.1f} images/s, mean loss {loss_sum / args.steps:.4f}")


def evaluate(args):
    """The baseline of examples/validate's eval pass: model.eval(), torch.no_grad(), the 10000
    test images in batches of --batch, logits argmaxed; images/s over the whole pass (the first
    batch included, as validate times it)."""
    x = read_idx(os.path.join(args.data, "t10k-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(args.data, "t10k-labels-idx1-ubyte.gz"))
    images = (torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1) - 0.2860) / 0.3530
    labels = torch.from_numpy(y.astype(np.int64))
    model = ResNet(args.depth, 1, 10)
    model.eval()
    correct = 0
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(0, len(images), args.batch):
            pred = model(images[i:i + args.batch]).argmax(1)
            correct += int((pred == labels[i:i + args.batch]).sum())
    secs = time.perf_counter() - t0
    print(f"torch {torch.__version__} resnet{args.depth} eval batch {args.batch}, {args.threads} threads: "
          f"{len(images)} images in {secs:.1f} s, {len(images) / secs:.1f} images/s "
          f"(accuracy {100.0 * correct / len(images):.2f}%, untrained)")


if __name__ == "__main__":
    main()
