"""BatchNorm: batch statistics of the global batch, in forward and backward ([bn] sync)."""

import ctypes

from .common import _DTYPES, _acting, _check, _shim, _state, _tensors


def _bn_sums(a, b, n):
    """a and b (contiguous float64) summed over ranks in place, and n with them: the total."""
    count = ctypes.c_uint64(n)
    t = _tensors([a, b])
    _check(_shim.dp_bn_stats(ctypes.byref(t[0]), ctypes.byref(t[1]), ctypes.byref(count)), "dp_bn_stats")
    return count.value


_one_pass_matches = {}  # dtype -> the one pass gives PyTorch's ops' bits (probed once)


def _one_pass(x, dy, gx, weight, m, v, gw, gb, eps, total, over_ranks):
    """dpshim_bn_backward on contiguous CPU tensors: gx in one pass. False where it cannot."""
    shape = x.shape
    inner = x.numel() // (shape[0] * shape[1]) if shape[0] and shape[1] else 0
    call = _shim.bn_backward_sited if over_ranks else _shim.dpshim_bn_backward
    ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
    return call(_DTYPES[x.dtype], shape[0], shape[1], inner, ptr(x), ptr(dy), ptr(gx), ptr(m), ptr(v), ptr(weight),
                ptr(gw), ptr(gb), eps, total, over_ranks) == 0


def _probe_one_pass(torch, dtype, ops_backward):
    """Whether the one pass rounds as PyTorch's ops in this build, bit for bit: both on random
    layers, this rank's sums only. The layers have planes of 19, 16 and 1 and 5 or 8 channels,
    so vector code and scalar tails count, for the pass and for the per-channel vectors alike;
    and a NaN plane and an infinity, so which NaN an operation gives counts too."""
    g = torch.Generator().manual_seed(7)
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    for shape in ((3, 5, 19), (4, 8, 16), (23, 6), (2, 8, 3, 3)):
        x, dy = torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g, dtype=dtype)
        x[0, 1], x[-1, 2] = float("nan"), float("inf")
        c, dims = shape[1], [0] + list(range(2, len(shape)))
        weight = torch.randn(c, generator=g, dtype=dtype)
        m, v = x.mean(dims), x.var(dims, unbiased=False)
        want, gw, gb = ops_backward(x, dy, weight, m, v, 1e-5, x.numel() // c, False)
        got = torch.empty_like(x)
        if not _one_pass(x, dy, got, weight, m, v, gw, gb, 1e-5, x.numel() // c, 0) or \
                not torch.equal(got.view(bits), want.view(bits)):
            return False
    return True


def _patch_batchnorm(torch):
    def ops_backward(x, dy, weight, m, v, eps, total, over_ranks):
        """The backward as PyTorch ops: the native kernel's direct term, then the statistics'."""
        n = x.numel() // x.shape[1] if x.shape[1] else 0
        gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
            dy, x, weight, m, v, None, None, False, eps, [True, True, True])
        # gb = sum(dy), gw = sum(dy * xhat) = invstd * sum(dy * (x - mean)), per channel
        invstd = torch.rsqrt(v.double() + eps)
        a = gb.double() * n
        b = gw.double() / invstd * n
        if over_ranks:
            _bn_sums(a, b, n)
        if n and total:
            gamma = weight.double() if weight is not None else torch.ones_like(invstd)
            k = gamma * invstd / (n * total)  # a and b back to this rank's convention, over the total
            # gx -= k * (a + (x - mean) * invstd^2 * b), as gx += x * slope + offset
            slope = -k * invstd * invstd * b
            offset = -k * a - slope * m.double()
            shape = [1, x.shape[1]] + [1] * (x.dim() - 2)  # a channel's broadcast
            gx.addcmul_(x, slope.to(x.dtype).view(shape)).add_(offset.to(x.dtype).view(shape))
        return gx, gw, gb

    class SyncedBatchNorm(torch.autograd.Function):
        """BatchNorm over the global batch on PyTorch's own kernels: per-channel sums of x and x*x,
        summed over ranks in float64 (dp_bn_stats, with the sample count),
        normalization by the native kernel with the global statistics; backward by the native
        kernel for the direct term and the affine gradients, plus the statistics' terms from
        per-channel sums over ranks, in one pass. Local gradients are of this rank's loss over
        its n samples: scaled by n they are per-sample and add up across ranks with unequal n,
        and dividing by n again returns to this rank's convention (as examples/nn/dpnn.c does).
        The statistics of the global batch go out through `stats` (a list the caller passes),
        not as outputs, which autograd would wrap and track."""

        @staticmethod
        def forward(ctx, x, weight, bias, eps, stats):
            dims = [0] + list(range(2, x.dim()))
            n = x.numel() // x.shape[1] if x.shape[1] else 0
            # summed in x's dtype (PyTorch's cascade sums; float64 accumulation costs 6x here)
            s = x.sum(dims).double()
            ss = (x * x).sum(dims).double()
            total = _bn_sums(s, ss, n)
            mean = s / total if total else s
            var = (ss / total - mean * mean).clamp(min=0) if total else ss
            m, v = mean.to(x.dtype), var.to(x.dtype)
            y = torch.batch_norm(x, weight, bias, m, v, False, 0.0, eps, False)
            ctx.save_for_backward(x, weight, m, v)
            ctx.eps, ctx.n, ctx.total = eps, n, total
            stats.append((mean, var, m, total))
            return y

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, dy):
            x, weight, m, v = ctx.saved_tensors
            dy = dy.contiguous()
            if _passes_once(x, weight):
                # the native kernel for the affine gradients only, the rest in one pass
                _, gw, gb = torch.ops.aten.native_batch_norm_backward(
                    dy, x, weight, m, v, None, None, False, ctx.eps, [False, True, True])
                gx = torch.empty_like(x)
                if not _one_pass(x, dy, gx, weight, m, v, gw, gb, ctx.eps, ctx.total, 1):
                    _check(-1, "BatchNorm's backward (dp_bn_stats)")
            else:
                gx, gw, gb = ops_backward(x, dy, weight, m, v, ctx.eps, ctx.total, True)
            affine = weight is not None
            return gx, gw if affine else None, gb if affine else None, None, None

    def _passes_once(x, weight):
        """One pass for a contiguous float32 or float64 layer (its weight, if any, contiguous and of
        its dtype) on the CPU where PyTorch runs one thread (with more, its three passes run in
        parallel) and the pass rounds as its ops."""
        if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or not x.is_contiguous() \
                or torch.get_num_threads() != 1 or \
                (weight is not None and (weight.dtype != x.dtype or not weight.is_contiguous())):
            return False
        if x.dtype not in _one_pass_matches:
            _one_pass_matches[x.dtype] = _probe_one_pass(torch, x.dtype, ops_backward)
        return _one_pass_matches[x.dtype]

    norm = torch.nn.modules.batchnorm._BatchNorm
    forward = norm.forward

    def synced_forward(self, x):
        # batch statistics are used in training, and always by a BatchNorm without running ones
        if (not self.training and not (self.running_mean is None and self.running_var is None)) or not _acting():
            return forward(self, x)
        self._check_input_dim(x)
        stats = []
        y = SyncedBatchNorm.apply(x, self.weight if self.affine else None, self.bias if self.affine else None,
                                  self.eps, stats)
        if self.training and self.track_running_stats and self.running_mean is not None:
            mean, var, m, total = stats[0]
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                f = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                t = float(total) / getattr(_state, "replicas", 1)  # a batch every rank took whole
                unbiased = var * (t / (t - 1)) if t > 1 else var
                rm, rv = self.running_mean, self.running_var
                rm.mul_(1 - f).add_(m if m.dtype == rm.dtype else mean.to(rm.dtype), alpha=f)
                rv.mul_(1 - f).add_(unbiased.to(rv.dtype), alpha=f)
        return y

    norm.forward = synced_forward
