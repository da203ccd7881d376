// The MNIST example of pytorch/examples (cpp/mnist), as a user would copy it: a CNN with two
// convolutions, feature dropout and dropout, log_softmax and nll_loss, SGD at lr 0.01 with
// momentum 0.5, batch 64, a test pass after each epoch. Its constants became arguments, and the
// training set can be its first N images (the sampler's size), for a short test:
//   mnist_cnn DATA_DIR [EPOCHS [N]]   (DATA_DIR holds the uncompressed IDX files, MNIST or Fashion-MNIST)
#include <torch/torch.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

// The batch size for training.
const int64_t kTrainBatchSize = 64;
// The batch size for testing.
const int64_t kTestBatchSize = 1000;
// After how many batches to log a new update with the loss value.
const int64_t kLogInterval = 10;

struct Net : torch::nn::Module {
    Net()
        : conv1(torch::nn::Conv2dOptions(1, 10, /*kernel_size=*/5)),
          conv2(torch::nn::Conv2dOptions(10, 20, /*kernel_size=*/5)), fc1(320, 50), fc2(50, 10)
    {
        register_module("conv1", conv1);
        register_module("conv2", conv2);
        register_module("conv2_drop", conv2_drop);
        register_module("fc1", fc1);
        register_module("fc2", fc2);
    }

    torch::Tensor forward(torch::Tensor x)
    {
        x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
        x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
        x = x.view({-1, 320});
        x = torch::relu(fc1->forward(x));
        x = torch::dropout(x, /*p=*/0.5, /*train=*/is_training());
        x = fc2->forward(x);
        return torch::log_softmax(x, /*dim=*/1);
    }

    torch::nn::Conv2d conv1;
    torch::nn::Conv2d conv2;
    torch::nn::Dropout2d conv2_drop;
    torch::nn::Linear fc1;
    torch::nn::Linear fc2;
};

template <typename DataLoader>
void train(size_t epoch, Net &model, torch::Device device, DataLoader &data_loader,
           torch::optim::Optimizer &optimizer, size_t dataset_size)
{
    model.train();
    size_t batch_idx = 0;
    for (auto &batch : data_loader) {
        auto data = batch.data.to(device), targets = batch.target.to(device);
        optimizer.zero_grad();
        auto output = model.forward(data);
        auto loss = torch::nll_loss(output, targets);
        AT_ASSERT(!std::isnan(loss.template item<float>()));
        loss.backward();
        optimizer.step();

        if (batch_idx++ % kLogInterval == 0) {
            std::printf("Train Epoch: %zu [%5zu/%5zu] Loss: %.4f\n", epoch, batch_idx * batch.data.size(0),
                        dataset_size, loss.template item<float>());
        }
    }
}

template <typename DataLoader>
void test(Net &model, torch::Device device, DataLoader &data_loader, size_t dataset_size)
{
    torch::NoGradGuard no_grad;
    model.eval();
    double test_loss = 0;
    int32_t correct = 0;
    for (const auto &batch : data_loader) {
        auto data = batch.data.to(device), targets = batch.target.to(device);
        auto output = model.forward(data);
        test_loss += torch::nll_loss(output, targets,
                                     /*weight=*/{}, torch::Reduction::Sum)
                         .template item<float>();
        auto pred = output.argmax(1);
        correct += pred.eq(targets).sum().template item<int64_t>();
    }

    test_loss /= dataset_size;
    std::printf("Test set: Average loss: %.4f | Accuracy: %.3f\n", test_loss,
                static_cast<double>(correct) / dataset_size);
}

auto main(int argc, char **argv) -> int
{
    if (argc < 2) {
        std::cerr << "usage: mnist_cnn DATA_DIR [EPOCHS [N]]\n";
        return 2;
    }
    const std::string kDataRoot = argv[1];
    const size_t kNumberOfEpochs = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 10;

    torch::manual_seed(1);

    torch::DeviceType device_type;
    if (torch::cuda::is_available()) {
        std::cout << "CUDA available! Training on GPU." << std::endl;
        device_type = torch::kCUDA;
    } else {
        std::cout << "Training on CPU." << std::endl;
        device_type = torch::kCPU;
    }
    torch::Device device(device_type);

    Net model;
    model.to(device);

    auto train_dataset = torch::data::datasets::MNIST(kDataRoot)
                             .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                             .map(torch::data::transforms::Stack<>());
    size_t train_dataset_size = train_dataset.size().value();
    if (argc > 3 && std::strtoul(argv[3], nullptr, 10) < train_dataset_size)
        train_dataset_size = std::strtoul(argv[3], nullptr, 10);
    auto train_loader = torch::data::make_data_loader(
        std::move(train_dataset), torch::data::samplers::SequentialSampler(train_dataset_size),
        kTrainBatchSize);

    auto test_dataset = torch::data::datasets::MNIST(kDataRoot, torch::data::datasets::MNIST::Mode::kTest)
                            .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                            .map(torch::data::transforms::Stack<>());
    const size_t test_dataset_size = test_dataset.size().value();
    auto test_loader = torch::data::make_data_loader(std::move(test_dataset), kTestBatchSize);

    torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));

    for (size_t epoch = 1; epoch <= kNumberOfEpochs; ++epoch) {
        train(epoch, model, device, *train_loader, optimizer, train_dataset_size);
        test(model, device, *test_loader, test_dataset_size);
    }
}
