"""One BatchNorm layer's forward and backward in training mode, CPU time of this thread (the best
of 15 rounds), at the bench models' layer shapes (dev.sh bench_bn_layer): alone it is PyTorch's
own kernel; under `mpirun -np 2 env LD_PRELOAD=libdpshim.so` the PyTorch adapter's exact
statistics of the global batch, the sums of both ranks included (a sleeping wait is no CPU time).
Prints `SHAPE forward_ms backward_ms` per shape, from rank 0 (or alone)."""

import os
import time

import torch

SHAPES = ((128, 16, 26, 26), (128, 32, 24, 24), (64, 16, 28, 28), (64, 128, 4, 4))


def best_of(rounds, bn, x):
    forward = backward = float("inf")
    for _ in range(rounds):
        xx = x.clone().requires_grad_(True)
        t0 = time.thread_time()
        y = bn(xx)
        t1 = time.thread_time()
        torch.autograd.grad(y, [xx, bn.weight, bn.bias], torch.ones_like(y))  # not .backward(): no gradient reduction
        t2 = time.thread_time()
        forward, backward = min(forward, t1 - t0), min(backward, t2 - t1)
    return forward, backward


def main():
    torch.set_num_threads(1)
    torch.manual_seed(1)
    for shape in SHAPES:
        bn = torch.nn.BatchNorm2d(shape[1]).train()
        forward, backward = best_of(15, bn, torch.randn(*shape))
        if os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0":
            print("%s %.3f %.3f" % ("x".join(map(str, shape)), 1000 * forward, 1000 * backward), flush=True)


if __name__ == "__main__":
    main()
