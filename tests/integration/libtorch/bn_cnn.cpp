// A small CNN with BatchNorm on libtorch, written as its users write them and knowing nothing of
// dpshim: 8x8 images computed from the sample's index, Conv2d -> BatchNorm2d -> ReLU ->
// InstanceNorm2d (per sample: libtorch calls batch_norm for it) -> max pool -> Linear ->
// BatchNorm1d (no affine parameters, momentum none: a cumulative average) -> ReLU -> Linear, SGD with
// momentum through a DataLoader, and after each epoch a test pass in eval mode (the running
// statistics) under NoGradGuard. Options: --epochs E (3)  --batch B (16)  --samples N (100)
//   --float (float32 instead of float64)  --penalty (a gradient penalty added to the loss: the
//   squared gradient of the loss with respect to the images, which differentiates twice)
// stdout: per epoch the mean training loss and the test result, then each BatchNorm's running
// statistics and a checksum of the weights. stderr: the training samples this process took per
// epoch.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>

namespace
{

struct Images : torch::data::datasets::Dataset<Images> {
    Images(size_t n, double shift, torch::Dtype dtype) : n_(n), shift_(shift), dtype_(dtype) {}
    torch::data::Example<> get(size_t i) override
    {
        double t = static_cast<double>(i) * 0.37 + shift_;
        int64_t label = std::sin(3.1 * t) + 0.3 * std::cos(t) > 0;
        auto x = torch::empty({1, 8, 8}, torch::kDouble);
        auto a = x.accessor<double, 3>();
        for (int r = 0; r < 8; r++)
            for (int c = 0; c < 8; c++)
                a[0][r][c] =
                    2.0 + std::sin(t + 0.5 * r) * std::cos(0.8 * t - 0.3 * c) +
                    (label ? 0.6 : -0.6) * std::exp(-0.2 * ((r - 3.5) * (r - 3.5) + (c - 2.0) * (c - 2.0)));
        return {x.to(dtype_), torch::tensor(label, torch::kLong)};
    }
    c10::optional<size_t> size() const override { return n_; }
    size_t n_;
    double shift_;
    torch::Dtype dtype_;
};

struct Net : torch::nn::Module {
    Net()
    {
        conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)));
        bn2 = register_module("bn2", torch::nn::BatchNorm2d(4));
        fc1 = register_module("fc1", torch::nn::Linear(64, 8));
        inorm = register_module("inorm",
                                torch::nn::InstanceNorm2d(torch::nn::InstanceNorm2dOptions(4).affine(true)));
        bn1 = register_module(
            "bn1",
            torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(8).affine(false).momentum(c10::nullopt)));
        fc2 = register_module("fc2", torch::nn::Linear(8, 2));
    }
    torch::Tensor forward(torch::Tensor x)
    {
        x = torch::max_pool2d(inorm(torch::relu(bn2(conv(x)))), 2);
        x = torch::relu(bn1(fc1(x.view({x.size(0), -1}))));
        return torch::log_softmax(fc2(x), 1);
    }
    torch::nn::Conv2d conv{nullptr};
    torch::nn::BatchNorm2d bn2{nullptr};
    torch::nn::InstanceNorm2d inorm{nullptr};
    torch::nn::Linear fc1{nullptr}, fc2{nullptr};
    torch::nn::BatchNorm1d bn1{nullptr};
};

void print_running(const char *name, const torch::Tensor &mean, const torch::Tensor &var,
                   const torch::Tensor &count)
{
    std::printf("%s running_mean", name);
    for (int64_t i = 0; i < mean.numel(); i++)
        std::printf(" %.15g", mean[i].item<double>());
    std::printf("\n%s running_var", name);
    for (int64_t i = 0; i < var.numel(); i++)
        std::printf(" %.15g", var[i].item<double>());
    std::printf("\n%s batches %lld\n", name, static_cast<long long>(count.item<int64_t>()));
}

} // namespace

int main(int argc, char **argv)
{
    int epochs = 3, batch = 16;
    size_t samples = 100;
    torch::Dtype dtype = torch::kDouble;
    bool penalty = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
        if (a == "--epochs")
            epochs = std::stoi(value());
        else if (a == "--batch")
            batch = std::stoi(value());
        else if (a == "--samples")
            samples = std::stoul(value());
        else if (a == "--float")
            dtype = torch::kFloat;
        else if (a == "--penalty")
            penalty = true;
        else
            return std::fprintf(stderr, "unknown option %s\n", a.c_str()), 2;
    }
    torch::manual_seed(7);
    auto net = std::make_shared<Net>();
    net->to(dtype);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
    auto train_set = Images(samples, 0.0, dtype).map(torch::data::transforms::Stack<>());
    auto test_set = Images(40, 0.11, dtype).map(torch::data::transforms::Stack<>());
    auto train_loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
        train_set, torch::data::DataLoaderOptions().batch_size(batch));
    auto test_loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
        test_set, torch::data::DataLoaderOptions().batch_size(16));
    for (int epoch = 1; epoch <= epochs; epoch++) {
        net->train();
        double loss_sum = 0;
        long batches = 0, seen = 0;
        for (auto &b : *train_loader) {
            opt.zero_grad();
            auto x = penalty ? b.data.clone().requires_grad_(true) : b.data;
            auto loss = torch::nll_loss(net->forward(x), b.target);
            if (penalty) {
                auto gx = torch::autograd::grad({loss}, {x}, {}, true, true)[0];
                (loss + 0.01 * gx.pow(2).sum()).backward();
            } else {
                loss.backward();
            }
            opt.step();
            loss_sum += loss.item<double>();
            batches++;
            seen += b.data.size(0);
        }
        net->eval();
        torch::NoGradGuard no_grad;
        double test_loss = 0;
        long correct = 0, total = 0;
        for (auto &b : *test_loader) {
            auto out = net->forward(b.data);
            test_loss += torch::nll_loss(out, b.target, {}, torch::Reduction::Sum).item<double>();
            correct += out.argmax(1).eq(b.target).sum().item<int64_t>();
            total += b.data.size(0);
        }
        std::printf("epoch %d loss %.15g test loss %.15g correct %ld/%ld\n", epoch, loss_sum / batches,
                    test_loss / static_cast<double>(total), correct, total);
        std::fflush(stdout);
        std::fprintf(stderr, "epoch %d trained on %ld samples in %ld batches\n", epoch, seen, batches);
    }
    print_running("bn2", net->bn2->running_mean, net->bn2->running_var, net->bn2->num_batches_tracked);
    print_running("bn1", net->bn1->running_mean, net->bn1->running_var, net->bn1->num_batches_tracked);
    double sum = 0;
    for (const auto &p : net->parameters())
        sum += p.abs().sum().item<double>();
    std::printf("weights %.15g\n", sum);
    return 0;
}
