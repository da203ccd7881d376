// The libtorch adapter's synchronized BatchNorm against its reference formulas, bit for bit, as
// tests/integration/bn_reference.py checks the PyTorch adapter's: the layer's output, the
// gradients of its input, weight and bias, and its running statistics, over layer shapes (1d, 2d,
// 3d; planes of 1 to 28 x 28), float32 and float64, affine or not, momentum or cumulative average
// (the factor a module passes), no running statistics, channels-last and non-contiguous inputs and
// gradients, unequal shares, non-finite and constant values. Each rank's share of a global batch
// comes from a libtorch sampler (split mode: the adapter synchronizes a batch it shared out, not
// one the program made itself, which every rank holds whole). The reference is the adapter's
// first implementation: every per-channel value in float64 as libtorch ops, summed over the ranks
// with dp_bn_stats, and the statistics' terms added with a channel's broadcast.
// Run under the shim at np >= 2 (every rank checks its own results), libtorch on THREADS threads
// (the first argument, default 1); prints "bitwise N, backward in one pass: DTYPES" (those the
// adapter's backward took the shim's single pass for, or none) and exits 0, or names the first
// difference and exits 1.
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>
#include <functional>
#include <set>
#include <string>
#include <vector>

#define DPSHIM_HOOKS_WEAK
#include "dpshim/hooks.h"

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace
{

std::set<std::string> one_pass; // the dtypes the adapter's backward ran the single pass for

// a, b (contiguous float64) summed over the ranks in place; n with them: the total
uint64_t sums(at::Tensor &a, at::Tensor &b, uint64_t n)
{
    dp_tensor t[2] = {{a.data_ptr(), static_cast<uint64_t>(a.numel()), DP_F64, DP_HOST, "ref_a"},
                      {b.data_ptr(), static_cast<uint64_t>(b.numel()), DP_F64, DP_HOST, "ref_b"}};
    if (dp_bn_stats(&t[0], &t[1], &n) != 0) {
        std::fprintf(stderr, "bn_reference: dp_bn_stats failed\n");
        std::exit(1);
    }
    return n;
}

struct Reference : torch::autograd::Function<Reference> {
    static variable_list forward(AutogradContext *ctx, const at::Tensor &x, const at::Tensor &weight,
                                 const at::Tensor &bias, double eps)
    {
        std::vector<int64_t> dims{0};
        for (int64_t d = 2; d < x.dim(); d++)
            dims.push_back(d);
        int64_t n = x.size(1) ? x.numel() / x.size(1) : 0;
        at::Tensor s = x.sum(dims).to(at::kDouble).contiguous(),
                   ss = (x * x).sum(dims).to(at::kDouble).contiguous();
        auto total = static_cast<int64_t>(sums(s, ss, static_cast<uint64_t>(n)));
        at::Tensor mean = total ? s / static_cast<double>(total) : s;
        at::Tensor var = total ? (ss / static_cast<double>(total) - mean * mean).clamp_min(0) : ss;
        at::Tensor m = mean.to(x.scalar_type()), v = var.to(x.scalar_type());
        at::Tensor y = at::batch_norm(x, weight, bias, m, v, false, 0.0, eps, false);
        ctx->save_for_backward({x, weight, m, v});
        ctx->saved_data["eps"] = eps;
        ctx->saved_data["total"] = total;
        ctx->mark_non_differentiable({mean, var});
        return {y, mean, var, torch::tensor(static_cast<double>(total), torch::kDouble)};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads)
    {
        auto saved = ctx->get_saved_variables();
        const at::Tensor &x = saved[0], &weight = saved[1], &m = saved[2], &v = saved[3];
        double eps = ctx->saved_data["eps"].toDouble();
        int64_t total = ctx->saved_data["total"].toInt(), n = x.size(1) ? x.numel() / x.size(1) : 0;
        at::Tensor dy = grads[0].contiguous();
        auto g = at::native_batch_norm_backward(dy, x, weight, m, v, at::Tensor(), at::Tensor(), false, eps,
                                                {true, true, true});
        at::Tensor gx = std::get<0>(g), gw = std::get<1>(g), gb = std::get<2>(g);
        at::Tensor invstd = at::rsqrt(v.to(at::kDouble) + eps);
        at::Tensor a = (gb.to(at::kDouble) * static_cast<double>(n)).contiguous();
        at::Tensor b = (gw.to(at::kDouble) / invstd * static_cast<double>(n)).contiguous();
        sums(a, b, static_cast<uint64_t>(n));
        if (n && total) {
            at::Tensor k =
                weight.to(at::kDouble) * invstd / (static_cast<double>(n) * static_cast<double>(total));
            at::Tensor slope = -k * invstd * invstd * b;
            at::Tensor offset = -k * a - slope * m.to(at::kDouble);
            std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
            shape[1] = x.size(1);
            gx.addcmul_(x, slope.to(x.scalar_type()).view(shape))
                .add_(offset.to(x.scalar_type()).view(shape));
        }
        return {gx, gw, gb, at::Tensor()};
    }
};

struct Case {
    std::vector<int64_t> plane;
    int64_t channels;
    at::ScalarType dtype;
    std::string option; // "" or one of those below
};

std::vector<Case> cases()
{
    std::vector<Case> out;
    for (auto dtype : {at::kFloat, at::kDouble}) {
        for (std::vector<int64_t> plane : {std::vector<int64_t>{},
                                           {7},
                                           {1, 1},
                                           {2, 2},
                                           {3, 3},
                                           {4, 4},
                                           {1, 17},
                                           {7, 7},
                                           {28, 28},
                                           {2, 3, 5}})
            for (int64_t channels : {3, 16, 33})
                out.push_back({plane, channels, dtype, ""});
        for (const char *option : {"no affine", "momentum none", "no running statistics", "channels last",
                                   "sliced", "dy transposed", "nonfinite", "constant"})
            out.push_back({{4, 4}, 8, dtype, option});
        out.push_back({{6, 6}, 8, dtype, "channels last"});
    }
    return out;
}

at::Tensor bits(const at::Tensor &t)
{
    at::Tensor c = t.detach().contiguous();
    if (c.scalar_type() == at::kFloat) return c.view(at::kInt);
    if (c.scalar_type() == at::kDouble) return c.view(at::kLong);
    return c;
}

std::string dtype_name(at::ScalarType t)
{
    return t == at::kFloat ? "float32" : "float64";
}

} // namespace

// Seen by the adapter before libdpshim.so's (the program's own symbols come first): counts the
// calls of the single pass per dtype, then makes the real one.
extern "C" __attribute__((visibility("default"))) int
dpshim_bn_backward(int dtype, uint64_t outer, uint64_t channels, uint64_t inner, const void *x,
                   const void *dy, void *gx, const void *mean, const void *var, const void *weight,
                   const void *gw, const void *gb, double eps, uint64_t total, int over_ranks)
{
    using Fn = int (*)(int, uint64_t, uint64_t, uint64_t, const void *, const void *, void *, const void *,
                       const void *, const void *, const void *, const void *, double, uint64_t, int);
    static const auto real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "dpshim_bn_backward"));
    int rc = real ? real(dtype, outer, channels, inner, x, dy, gx, mean, var, weight, gw, gb, eps, total,
                         over_ranks)
                  : -1;
    if (rc == 0 && over_ranks) one_pass.insert(dtype_name(dtype == DP_F32 ? at::kFloat : at::kDouble));
    return rc;
}

int main(int argc, char **argv)
{
    if (!dp_bn_stats) {
        std::fprintf(stderr, "bn_reference: run it under LD_PRELOAD=libdpshim.so\n");
        return 2;
    }
    at::set_num_threads(argc > 1 ? std::atoi(argv[1]) : 1);
    const char *r = std::getenv("OMPI_COMM_WORLD_RANK");
    int rank = r ? std::atoi(r) : 0;
    auto all = cases();
    int checked = 0;
    for (size_t i = 0; i < all.size(); i++) {
        const Case &c = all[i];
        auto g = at::make_generator<at::CPUGeneratorImpl>(1000 * i + static_cast<uint64_t>(rank));
        auto p = at::make_generator<at::CPUGeneratorImpl>(i);
        auto opts = at::TensorOptions().dtype(c.dtype);
        bool affine = c.option != "no affine", running = c.option != "no running statistics";
        // the same on every rank (the adapter makes parameters so at the first call)
        at::Tensor weight = affine ? at::rand({c.channels}, p, opts) + 0.5 : at::Tensor();
        at::Tensor bias = affine ? at::randn({c.channels}, p, opts) : at::Tensor();
        at::Tensor stats[2][2]; // the adapter's and the reference's running mean and variance
        for (auto &s : stats)
            if (running) s[0] = at::zeros({c.channels}, opts), s[1] = at::ones({c.channels}, opts);
        // this rank's share of a global batch of 11 to 17, from a sampler through the adapter
        const size_t global = 11 + 2 * (i % 4);
        torch::data::samplers::SequentialSampler sampler(global);
        for (int step = 0; step < 3; step++) {
            sampler.reset();
            auto share = sampler.next(global);
            std::vector<int64_t> shape{share ? static_cast<int64_t>(share->size()) : 0, c.channels};
            shape.insert(shape.end(), c.plane.begin(), c.plane.end());
            at::Tensor x = at::randn(shape, g, opts) * 2 + 0.5;
            if (c.option == "constant") x = at::full_like(x, 0.25);
            if (c.option == "nonfinite" && step == 2) {
                x[0][1].fill_(NAN);
                x[-1][2].fill_(INFINITY);
            }
            if (c.option == "channels last") x = x.contiguous(at::MemoryFormat::ChannelsLast);
            if (c.option == "sliced") x = at::cat({x, x}, 3); // every other column of a wider tensor
            auto seen = [&](const at::Tensor &t) {
                return c.option == "sliced" ? t.slice(3, 0, c.plane[1] * 2, 2) : t;
            };
            at::Tensor dy = at::randn(seen(x).sizes(), g, opts);
            if (c.option == "dy transposed") dy = dy.transpose(2, 3).contiguous().transpose(2, 3);
            // a module's factor: its momentum, or 1 / batches seen for a cumulative average
            double momentum = c.option == "momentum none" ? 1.0 / (step + 1) : 0.1;
            std::vector<std::pair<std::string, at::Tensor>> results[2];
            for (int which = 0; which < 2; which++) {
                at::Tensor xx = x.clone().requires_grad_(true);
                at::Tensor w = affine ? weight.clone().requires_grad_(true) : at::Tensor();
                at::Tensor b = affine ? bias.clone().requires_grad_(true) : at::Tensor();
                at::Tensor &rm = stats[which][0], &rv = stats[which][1];
                at::Tensor y;
                if (which == 0) { // as a module calls it: through at::batch_norm, which the adapter takes
                    y = torch::nn::functional::batch_norm(seen(xx), rm, rv,
                                                          torch::nn::functional::BatchNormFuncOptions()
                                                              .weight(w)
                                                              .bias(b)
                                                              .training(true)
                                                              .momentum(momentum)
                                                              .eps(1e-5));
                } else { // the reference, and the running statistics as the adapter updates them
                    auto out = Reference::apply(seen(xx), affine ? w : at::ones({c.channels}, opts),
                                                affine ? b : at::zeros({c.channels}, opts), 1e-5);
                    y = out[0];
                    if (running) {
                        at::NoGradGuard no_grad;
                        double t = out[3].item<double>();
                        rm.mul_(1 - momentum).add_(out[1].to(rm.scalar_type()), momentum);
                        at::Tensor unbiased = t > 1 ? out[2] * (t / (t - 1)) : out[2];
                        rv.mul_(1 - momentum).add_(unbiased.to(rv.scalar_type()), momentum);
                    }
                }
                std::vector<at::Tensor> wanted{xx};
                if (affine) wanted.push_back(w), wanted.push_back(b);
                auto grads = torch::autograd::grad({y}, wanted, {dy}); // no gradient reduction
                results[which] = {{"output", y}, {"input grad", grads[0]}};
                if (affine)
                    results[which].push_back({"weight grad", grads[1]}),
                        results[which].push_back({"bias grad", grads[2]});
                if (running)
                    results[which].push_back({"running_mean", rm.clone()}),
                        results[which].push_back({"running_var", rv.clone()});
            }
            for (size_t k = 0; k < results[0].size(); k++) {
                if (!at::equal(bits(results[0][k].second), bits(results[1][k].second))) {
                    std::printf(
                        "rank %d: case %zu (%lld channels, %s, %s), step %d: %s differs from the reference\n",
                        rank, i, static_cast<long long>(c.channels), dtype_name(c.dtype).c_str(),
                        c.option.empty() ? "plain" : c.option.c_str(), step, results[0][k].first.c_str());
                    return 1;
                }
                checked++;
            }
        }
    }
    std::string dtypes;
    for (const auto &d : one_pass)
        dtypes += (dtypes.empty() ? "" : " ") + d;
    std::printf("bitwise %d, backward in one pass: %s\n", checked, dtypes.empty() ? "none" : dtypes.c_str());
    return 0;
}
