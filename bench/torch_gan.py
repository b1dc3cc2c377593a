"""The DCGAN of examples/gan.c in PyTorch, for its step time: the same
generator, discriminator and judging classifier, the same alternating step
(D on real and fake.detach(), G through D(fake), the classifier on the real
batch), Adam(2e-4, betas (0.5, 0.999)) and Adam(1e-3), batch 64, on random
[-1, 1] images (the loader's work is not what is compared).

    /usr/bin/python3 bench/torch_gan.py --steps 50 --threads 2

prints the seconds per step after --warmup steps."""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# One definition of G and D, shared with the fixture generator of tests/test_examples_torch.c.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
from example_models import Discriminator, Generator  # noqa: E402

ZDIM, WIDTH = 32, 32  # examples/gan.c's


def models():
    g, d = Generator(ZDIM, WIDTH), Discriminator(WIDTH)
    c = nn.Sequential(
        nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10))
    return g, d, c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    g, d, c = models()
    gopt = torch.optim.Adam(g.parameters(), 2e-4, betas=(0.5, 0.999))
    dopt = torch.optim.Adam(d.parameters(), 2e-4, betas=(0.5, 0.999))
    copt = torch.optim.Adam(c.parameters(), 1e-3)
    ones, zeros = torch.ones(a.batch, 1), torch.zeros(a.batch, 1)
    real = torch.rand(a.batch, 1, 28, 28) * 2 - 1
    labels = torch.randint(0, 10, (a.batch,))

    def step():
        fake = g(torch.randn(a.batch, ZDIM, 1, 1))
        ld = F.binary_cross_entropy_with_logits(d(real), ones) + \
            F.binary_cross_entropy_with_logits(d(fake.detach()), zeros)
        dopt.zero_grad()
        ld.backward()
        dopt.step()
        lg = F.binary_cross_entropy_with_logits(d(fake), ones)
        gopt.zero_grad()
        lg.backward(inputs=list(g.parameters()))
        gopt.step()
        lc = F.cross_entropy(c(real), labels)
        copt.zero_grad()
        lc.backward()
        copt.step()

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = (time.perf_counter() - t0) / a.steps
    print(f"torch {torch.__version__}, {a.threads} threads, batch {a.batch}: "
          f"{dt * 1000:.1f} ms per step over {a.steps} steps")


if __name__ == "__main__":
    main()
