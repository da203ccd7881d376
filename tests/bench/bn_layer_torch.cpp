// One BatchNorm layer's forward and backward in training mode on libtorch, CPU time of this thread
// (the best of 15 rounds), at the bench models' layer shapes, as tests/bench/bn_layer.py times
// PyTorch's: alone it is libtorch's own kernel; under `mpirun -np 2 env LD_PRELOAD=libdpshim.so`
// the libtorch adapter's exact statistics of the global batch, the sums of both ranks included (a
// sleeping wait is no CPU time). Each rank's batch is its share of a global batch from a
// SequentialSampler, so that the adapter takes it as shared out. Prints `SHAPE forward_ms
// backward_ms` per shape, from rank 0 (or alone).
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>

namespace
{

double thread_seconds()
{
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

} // namespace

int main()
{
    at::set_num_threads(1);
    torch::manual_seed(1);
    const char *size_env = std::getenv("OMPI_COMM_WORLD_SIZE"),
               *rank_env = std::getenv("OMPI_COMM_WORLD_RANK");
    const int64_t ranks = size_env ? std::atoi(size_env) : 1;
    const bool print = !rank_env || std::atoi(rank_env) == 0;
    const int64_t shapes[][4] = {{128, 16, 26, 26}, {128, 32, 24, 24}, {64, 16, 28, 28}, {64, 128, 4, 4}};
    for (const auto &s : shapes) {
        torch::nn::BatchNorm2d bn(s[1]);
        bn->train();
        torch::data::samplers::SequentialSampler sampler(static_cast<size_t>(s[0] * ranks));
        double forward = std::numeric_limits<double>::infinity(), backward = forward;
        for (int round = 0; round < 15; round++) {
            sampler.reset();
            auto share = sampler.next(static_cast<size_t>(s[0] * ranks)); // this rank's: s[0] samples
            auto x =
                torch::randn({static_cast<int64_t>(share->size()), s[1], s[2], s[3]}).requires_grad_(true);
            double t0 = thread_seconds();
            auto y = bn->forward(x);
            double t1 = thread_seconds();
            // not backward(): no gradient reduction
            torch::autograd::grad({y}, {x, bn->weight, bn->bias}, {torch::ones_like(y)});
            double t2 = thread_seconds();
            forward = std::min(forward, t1 - t0), backward = std::min(backward, t2 - t1);
        }
        if (print)
            std::printf("%lldx%lldx%lldx%lld %.3f %.3f\n", static_cast<long long>(s[0]),
                        static_cast<long long>(s[1]), static_cast<long long>(s[2]),
                        static_cast<long long>(s[3]), 1000 * forward, 1000 * backward);
    }
    return 0;
}
