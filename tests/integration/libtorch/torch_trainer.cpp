// A C++ trainer on libtorch, written as its users write them and knowing nothing of dpshim: a
// small classifier on a data set computed from the sample's index, trained through a DataLoader
// and tested under NoGradGuard after each epoch. Options choose the patterns the libtorch
// adapter must handle:
//   --opt sgd|adam|adamw|rmsprop|adagrad|lbfgs   --sampler sequential|random|alternate (odd epochs
//   through the sequential loader, even ones through the random one)   --workers N
//   --epochs E   --batch B   --two (two optimizers, one per half of the model)
//   --manual (batches cut by hand, no DataLoader)   --save PATH (torch::save of model and optimizer)
//   --float (float32 instead of float64)   --samples N (training samples, 100)   --hidden H (16)
//   --eval-every K (a test pass after every K training batches too)   --draw (a random number
//   drawn after training, on stderr)   --load PATH (model and optimizer from PATH.*.pt first)
//   --cuda (the model and each batch on the GPU)   --kill R (the process of MPI rank R ends with
//   SIGKILL before its second batch, as a rank lost to the OOM killer; with --kill-epoch E, before
//   epoch E starts)   --accumulate K (gradients
//   of K batches summed, one step for them: zero_grad before the first, step after the K-th)
//   --per-sample (the loss per sample, Reduction::None, backpropagated with 1/B as its gradient)
//   --shape-one (the loss added up in torch::zeros({1}), as some trainers write it)
// stdout: per epoch the mean training loss and the test result, then a checksum of the weights,
// a hash of their bytes and the elements of the first optimizer's state in this process.
// stderr: the training samples this process took per epoch, and the epoch's time.
#include <torch/torch.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

namespace
{

struct Points : torch::data::datasets::Dataset<Points> {
    Points(size_t n, double shift, torch::Dtype dtype) : n_(n), shift_(shift), dtype_(dtype) {}
    torch::data::Example<> get(size_t i) override
    {
        double t = static_cast<double>(i) * 0.37 + shift_;
        auto x = torch::tensor({std::sin(t), std::cos(1.3 * t), std::sin(0.7 * t + 1), std::cos(0.2 * t)},
                               torch::TensorOptions().dtype(torch::kDouble))
                     .to(dtype_);
        auto y = torch::tensor(static_cast<int64_t>(std::sin(3.1 * t) + 0.3 * std::cos(t) > 0), torch::kLong);
        return {x, y};
    }
    c10::optional<size_t> size() const override { return n_; }
    size_t n_;
    double shift_;
    torch::Dtype dtype_;
};

struct Net : torch::nn::Module {
    explicit Net(int hidden)
    {
        a = register_module("a", torch::nn::Linear(4, hidden));
        b = register_module("b", torch::nn::Linear(hidden, 2));
    }
    torch::Tensor forward(torch::Tensor x) { return torch::log_softmax(b(torch::tanh(a(x))), 1); }
    torch::nn::Linear a{nullptr}, b{nullptr};
};

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string &kind,
                                                        std::vector<torch::Tensor> params)
{
    namespace o = torch::optim;
    if (kind == "sgd") return std::make_unique<o::SGD>(params, o::SGDOptions(0.1).momentum(0.5));
    if (kind == "adam") return std::make_unique<o::Adam>(params, o::AdamOptions(0.01));
    if (kind == "adamw") return std::make_unique<o::AdamW>(params, o::AdamWOptions(0.01));
    if (kind == "rmsprop") return std::make_unique<o::RMSprop>(params, o::RMSpropOptions(0.01));
    if (kind == "adagrad") return std::make_unique<o::Adagrad>(params, o::AdagradOptions(0.1));
    if (kind == "lbfgs") return std::make_unique<o::LBFGS>(params, o::LBFGSOptions(0.5).max_iter(4));
    std::fprintf(stderr, "unknown optimizer %s\n", kind.c_str());
    std::exit(2);
}

// The elements of the optimizer's state tensors.
int64_t state_elements(torch::optim::Optimizer &opt)
{
    namespace o = torch::optim;
    int64_t n = 0;
    auto add = [&](const torch::Tensor &t) { n += t.defined() ? t.numel() : 0; };
    for (auto &kv : opt.state()) {
        auto *s = kv.second.get();
        if (auto *a = dynamic_cast<o::AdamParamState *>(s))
            add(a->exp_avg()), add(a->exp_avg_sq()), add(a->max_exp_avg_sq());
        else if (auto *w = dynamic_cast<o::AdamWParamState *>(s))
            add(w->exp_avg()), add(w->exp_avg_sq()), add(w->max_exp_avg_sq());
        else if (auto *r = dynamic_cast<o::RMSpropParamState *>(s))
            add(r->square_avg()), add(r->momentum_buffer()), add(r->grad_avg());
        else if (auto *g = dynamic_cast<o::AdagradParamState *>(s))
            add(g->sum());
        else if (auto *m = dynamic_cast<o::SGDParamState *>(s))
            add(m->momentum_buffer());
    }
    return n;
}

} // namespace

int main(int argc, char **argv)
{
    std::string opt_kind = "sgd", sampler = "sequential", save, load;
    int workers = 0, epochs = 3, batch = 16, hidden = 16;
    size_t samples = 100;
    bool two = false, manual = false, draw = false;
    torch::Device device(torch::kCPU);
    int eval_every = 0;
    int kill_rank = -1; // --kill R: the process of MPI rank R is SIGKILLed before its 2nd batch
    int kill_epoch = 0; // --kill-epoch E: or before epoch E starts (its sampler drawn)
    int accumulate = 1;
    bool per_sample = false, shape_one = false;
    const char *mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
    torch::Dtype dtype = torch::kDouble;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
        if (a == "--opt")
            opt_kind = value();
        else if (a == "--sampler")
            sampler = value();
        else if (a == "--workers")
            workers = std::stoi(value());
        else if (a == "--epochs")
            epochs = std::stoi(value());
        else if (a == "--batch")
            batch = std::stoi(value());
        else if (a == "--save")
            save = value();
        else if (a == "--load")
            load = value();
        else if (a == "--two")
            two = true;
        else if (a == "--manual")
            manual = true;
        else if (a == "--float")
            dtype = torch::kFloat;
        else if (a == "--samples")
            samples = std::stoul(value());
        else if (a == "--hidden")
            hidden = std::stoi(value());
        else if (a == "--eval-every")
            eval_every = std::stoi(value());
        else if (a == "--draw")
            draw = true;
        else if (a == "--cuda")
            device = torch::Device(torch::kCUDA);
        else if (a == "--kill")
            kill_rank = std::stoi(value());
        else if (a == "--kill-epoch")
            kill_epoch = std::stoi(value());
        else if (a == "--accumulate")
            accumulate = std::stoi(value());
        else if (a == "--per-sample")
            per_sample = true;
        else if (a == "--shape-one")
            shape_one = true;
        else
            return std::fprintf(stderr, "unknown option %s\n", a.c_str()), 2;
    }
    torch::manual_seed(7);
    auto net = std::make_shared<Net>(hidden);
    net->to(device, dtype);
    std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
    if (two) {
        opts.push_back(make_optimizer(opt_kind, net->a->parameters()));
        opts.push_back(make_optimizer("adam", net->b->parameters()));
    } else {
        opts.push_back(make_optimizer(opt_kind, net->parameters()));
    }
    if (!load.empty()) {
        torch::load(net, load + ".model.pt");
        torch::load(*opts[0], load + ".optim.pt");
    }
    auto train_set = Points(samples, 0.0, dtype).map(torch::data::transforms::Stack<>());
    auto test_set = Points(40, 0.11, dtype).map(torch::data::transforms::Stack<>());
    auto options = torch::data::DataLoaderOptions().batch_size(batch).workers(workers);
    auto test_loader =
        torch::data::make_data_loader(test_set, torch::data::DataLoaderOptions().batch_size(16));
    auto seq_loader =
        torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(train_set, options);
    auto rand_loader =
        torch::data::make_data_loader<torch::data::samplers::RandomSampler>(train_set, options);
    Points raw(samples, 0.0, dtype);
    auto all = raw.get_batch([&] {
        std::vector<size_t> v(samples);
        for (size_t i = 0; i < v.size(); i++)
            v[i] = i;
        return v;
    }());
    auto whole = torch::data::transforms::Stack<>().apply_batch(all);
    auto test_pass = [&](long &correct, long &total) {
        torch::NoGradGuard no_grad;
        double loss = 0;
        for (auto &b : *test_loader) {
            auto out = net->forward(b.data.to(device));
            auto target = b.target.to(device);
            loss += torch::nll_loss(out, target, {}, torch::Reduction::Sum).item<double>();
            correct += out.argmax(1).eq(target).sum().item<int64_t>();
            total += b.data.size(0);
        }
        return loss / static_cast<double>(total);
    };

    for (int epoch = 1; epoch <= epochs; epoch++) {
        if (epoch == kill_epoch && mpi_rank && std::atoi(mpi_rank) == kill_rank) raise(SIGKILL);
        double loss_sum = 0;
        long batches = 0, seen = 0;
        auto began = std::chrono::steady_clock::now();
        auto train_on = [&](const torch::Tensor &x_here, const torch::Tensor &y_here) {
            if (!kill_epoch && epoch == 1 && batches == 1 && mpi_rank && std::atoi(mpi_rank) == kill_rank)
                raise(SIGKILL);
            auto x = x_here.to(device), y = y_here.to(device);
            auto loss_of = [&] {
                for (auto &o : opts)
                    if (batches % accumulate == 0) o->zero_grad();
                if (per_sample) {
                    auto per = torch::nll_loss(net->forward(x), y, {}, torch::Reduction::None);
                    per.backward(torch::full_like(per, 1.0 / static_cast<double>(per.size(0))));
                    return per.detach().mean();
                }
                auto loss = torch::nll_loss(net->forward(x), y);
                if (shape_one) loss = torch::zeros({1}, loss.options()) + loss;
                loss.backward();
                return loss;
            };
            torch::Tensor loss;
            if (opt_kind == "lbfgs" && !two) {
                loss = opts[0]->step(loss_of);
            } else {
                loss = loss_of();
                for (auto &o : opts)
                    if ((batches + 1) % accumulate == 0) o->step();
            }
            loss_sum += loss.item<double>();
            batches++;
            seen += x.size(0);
            if (eval_every && batches % eval_every == 0) {
                long correct = 0, total = 0;
                double l = test_pass(correct, total);
                std::printf("batch %ld test loss %.15g correct %ld/%ld\n", batches, l, correct, total);
            }
        };
        if (manual) {
            for (int64_t at = 0; at < static_cast<int64_t>(samples); at += batch)
                train_on(whole.data.slice(0, at, at + batch), whole.target.slice(0, at, at + batch));
        } else if (sampler == "random" || (sampler == "alternate" && epoch % 2 == 0)) {
            for (auto &b : *rand_loader)
                train_on(b.data, b.target);
        } else {
            for (auto &b : *seq_loader)
                train_on(b.data, b.target);
        }
        double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
        long correct = 0, total = 0;
        double test_loss = test_pass(correct, total);
        std::printf("epoch %d loss %.15g test loss %.15g correct %ld/%ld\n", epoch, loss_sum / batches,
                    test_loss, correct, total);
        std::fflush(stdout);
        std::fprintf(stderr, "epoch %d trained on %ld samples in %ld batches in %.3f s\n", epoch, seen,
                     batches, took);
    }
    double sum = 0;
    for (const auto &p : net->parameters())
        sum += p.abs().sum().item<double>();
    std::printf("weights %.15g\n", sum);
    uint64_t hash = 1469598103934665603ull;
    for (const auto &p : net->parameters()) {
        auto c = p.contiguous().cpu();
        auto *b = static_cast<const unsigned char *>(c.data_ptr());
        for (size_t i = 0; i < c.nbytes(); i++)
            hash = (hash ^ b[i]) * 1099511628211ull;
    }
    std::printf("weights_hash %016llx\n", static_cast<unsigned long long>(hash));
    std::printf("state_elements %lld\n", static_cast<long long>(state_elements(*opts[0])));
    if (draw) std::fprintf(stderr, "draw %.17g\n", torch::rand({1}, torch::kDouble).item<double>());
    if (!save.empty()) {
        torch::save(net, save + ".model.pt");
        torch::save(*opts[0], save + ".optim.pt");
    }
    return 0;
}
