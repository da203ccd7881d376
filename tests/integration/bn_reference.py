"""The PyTorch adapter's synchronized BatchNorm against its reference formulas, bit for bit: the
layer's output, the gradients of its input, weight and bias, and its running statistics, over
layer shapes (BatchNorm1d, 2d, 3d; planes of 1 to 28 x 28), float32 and float64, affine or not,
momentum or cumulative average, channels-last and non-contiguous inputs and gradients, unequal
and one-sample shares, and non-finite values. The reference is the adapter's first implementation:
every per-channel value in torch float64 and the statistics' terms added with a channel's
broadcast. Run under the shim at np >= 2 (every rank checks its own results), with PyTorch on
THREADS threads (first argument, default 1); prints `bitwise N, backward in one pass: DTYPES`
(those whose backward took dpshim's single pass, or none) and exits 0, or names the first
difference and exits 1."""

import copy
import os
import sys

import torch

from dpshim_pytorch.batchnorm import _bn_sums
from dpshim_pytorch.common import _state


class Reference(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        dims = [0] + list(range(2, x.dim()))
        n = x.numel() // x.shape[1] if x.shape[1] else 0
        s = x.sum(dims).double().contiguous()
        ss = (x * x).sum(dims).double().contiguous()
        total = _bn_sums(s, ss, n)
        mean = s / total if total else s
        var = (ss / total - mean * mean).clamp(min=0) if total else ss
        m, v = mean.to(x.dtype), var.to(x.dtype)
        y = torch.batch_norm(x, weight, bias, m, v, False, 0.0, eps, False)
        ctx.save_for_backward(x, weight, m, v)
        ctx.eps, ctx.n, ctx.total = eps, n, total
        ctx.mark_non_differentiable(mean, var)
        return y, mean, var, torch.tensor(float(total), dtype=torch.float64)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, _mean, _var, _total):
        x, weight, m, v = ctx.saved_tensors
        dy = dy.contiguous()
        gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
            dy, x, weight, m, v, None, None, False, ctx.eps, [True, True, True])
        invstd = torch.rsqrt(v.double() + ctx.eps)
        n, total, shape = ctx.n, ctx.total, [1, x.shape[1]] + [1] * (x.dim() - 2)
        a = (gb.double() * n).contiguous()
        b = (gw.double() / invstd * n).contiguous()
        _bn_sums(a, b, n)
        if n and total:
            gamma = weight.double() if weight is not None else torch.ones_like(invstd)
            k = gamma * invstd / (n * total)
            slope = -k * invstd * invstd * b
            offset = -k * a - slope * m.double()
            gx.addcmul_(x, slope.to(x.dtype).view(shape)).add_(offset.to(x.dtype).view(shape))
        affine = weight is not None
        return gx, gw if affine else None, gb if affine else None, None


def reference_forward(self, x):
    y, mean, var, total = Reference.apply(x, self.weight if self.affine else None,
                                          self.bias if self.affine else None, self.eps)
    if self.track_running_stats and self.running_mean is not None:
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            t = float(total) / getattr(_state, "replicas", 1)
            unbiased = var * (t / (t - 1)) if t > 1 else var
            self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
            self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
    return y


def bits(t):
    if t is None:
        return None
    t = t.detach().contiguous()
    return t.view({torch.float32: torch.int32, torch.float64: torch.int64}.get(t.dtype, t.dtype))


def cases():
    """(name, module factory, input shape on this rank without the batch, batch, dtype, options)"""
    out = []
    for dtype in (torch.float32, torch.float64):
        for kind, plane in ((torch.nn.BatchNorm1d, ()), (torch.nn.BatchNorm1d, (7,)), (torch.nn.BatchNorm2d, (1, 1)),
                            (torch.nn.BatchNorm2d, (2, 2)), (torch.nn.BatchNorm2d, (3, 3)), (torch.nn.BatchNorm2d, (4, 4)),
                            (torch.nn.BatchNorm2d, (1, 17)), (torch.nn.BatchNorm2d, (7, 7)),
                            (torch.nn.BatchNorm2d, (28, 28)), (torch.nn.BatchNorm3d, (2, 3, 5))):
            for channels in (3, 16, 33):
                out.append((kind, channels, plane, dtype, {}))
        out += [(torch.nn.BatchNorm2d, 8, (4, 4), dtype, {"affine": False}),
                (torch.nn.BatchNorm2d, 8, (5, 5), dtype, {"momentum": None}),
                (torch.nn.BatchNorm2d, 8, (4, 4), dtype, {"track_running_stats": False}),
                (torch.nn.BatchNorm2d, 8, (4, 4), dtype, {"channels_last": True}),
                (torch.nn.BatchNorm2d, 8, (6, 6), dtype, {"channels_last": True}),
                (torch.nn.BatchNorm2d, 8, (4, 4), dtype, {"sliced": True}),
                (torch.nn.BatchNorm2d, 8, (4, 4), dtype, {"dy_transposed": True}),
                (torch.nn.BatchNorm2d, 8, (4, 4), dtype, {"one_sample": True}),
                (torch.nn.BatchNorm2d, 8, (4, 4), dtype, {"nonfinite": True}),
                (torch.nn.BatchNorm2d, 8, (3, 3), dtype, {"constant": True})]
    return out


def main():
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    checked = 0
    for i, (kind, channels, plane, dtype, opt) in enumerate(cases()):
        g = torch.Generator().manual_seed(1000 * i + rank)
        module_opt = {k: opt[k] for k in ("affine", "momentum", "track_running_stats") if k in opt}
        new = kind(channels, **module_opt).to(dtype).train()
        if new.affine:  # the same on every rank (the adapter makes them so at the first call)
            p = torch.Generator().manual_seed(i)
            with torch.no_grad():
                new.weight.copy_(torch.rand(channels, generator=p, dtype=dtype) + 0.5)
                new.bias.copy_(torch.randn(channels, generator=p, dtype=dtype))
        ref = copy.deepcopy(new)
        batch = 1 if opt.get("one_sample") and rank == 1 else 5 + 3 * rank + i % 4
        for step in range(3):
            x = torch.randn(batch, channels, *plane, generator=g, dtype=dtype) * 2 + 0.5
            if opt.get("constant"):
                x = torch.full_like(x, 0.25)
            if opt.get("nonfinite") and batch and step == 2:
                x[0, 1] = float("nan")
                x[-1, 2] = float("inf")
            if opt.get("channels_last"):
                x = x.contiguous(memory_format=torch.channels_last)
            if opt.get("sliced"):  # every other column of a wider tensor
                x = torch.cat([x, x], dim=3)
            seen = (lambda v: v[..., ::2]) if opt.get("sliced") else (lambda v: v)
            dy = torch.randn(seen(x).shape, generator=g, dtype=dtype)
            if opt.get("dy_transposed"):
                dy = dy.transpose(2, 3).contiguous().transpose(2, 3)
            results = []
            for module, call in ((new, lambda m, v: m(v)), (ref, reference_forward)):
                xx = x.clone().requires_grad_(True)
                y = call(module, seen(xx))
                wanted = [xx] + ([module.weight, module.bias] if module.affine else [])
                grads = torch.autograd.grad(y, wanted, dy)  # not .backward(): no gradient reduction
                results.append([("output", y)] + list(zip(("input grad", "weight grad", "bias grad"), grads)) +
                               [(name, getattr(module, name)) for name in
                                ("running_mean", "running_var", "num_batches_tracked")])
            for (name, a), (_, b) in zip(*results):
                if not (a is None and b is None) and not torch.equal(bits(a), bits(b)):
                    print("rank %d: %s, %d channels, plane %s, %s, %s, step %d: %s differs from the reference"
                          % (rank, kind.__name__, channels, plane, dtype, opt, step, name), flush=True)
                    return 1
                checked += 1
    from dpshim_pytorch.batchnorm import _one_pass_matches
    one_pass = [str(t).replace("torch.", "") for t, yes in _one_pass_matches.items() if yes]
    print("bitwise %d, backward in one pass: %s" % (checked, " ".join(sorted(one_pass)) or "none"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
