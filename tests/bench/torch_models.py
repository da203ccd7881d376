"""Models and synthetic data for the side-by-side benchmark of dpshim against PyTorch DDP
(dev.sh bench_ddp), shared by torch_plain.py and torch_ddp.py so that both train the same thing."""

import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvNet(nn.Module):
    """A small CNN with BatchNorm on 28x28 one-channel inputs (Fashion-MNIST-sized): few
    parameters (0.3M), so a step is mostly compute and many small collectives."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, bias=False)  # BatchNorm follows: a bias would cancel out
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


VOCAB, DIM, TOKENS = 100_000, 80, 32


class EmbedNet(nn.Module):
    """A parameter-heavy model: a dense (sparse=False) bag of embeddings, 100 000 x 80 = 8M
    parameters, whose full 32 MB gradient is reduced every step, and little compute."""

    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(VOCAB, DIM, mode="mean", sparse=False)
        self.fc1 = nn.Linear(DIM, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, tokens):
        return self.fc2(F.relu(self.fc1(self.emb(tokens))))


def build(name, samples=8192, seed=1):
    """(model, optimizer factory, loss function, dataset) for `cnn` or `embed`; the data comes
    from a generator of its own, so every process builds the same dataset whatever it seeded."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (samples,), generator=g)
    if name == "cnn":
        data = torch.randn(samples, 1, 28, 28, generator=g)
        return (ConvNet(), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), F.nll_loss,
                torch.utils.data.TensorDataset(data, labels))
    if name == "embed":
        tokens = torch.randint(0, VOCAB, (samples, TOKENS), generator=g)
        return (EmbedNet(), lambda ps: torch.optim.Adam(ps, lr=1e-3), F.cross_entropy,
                torch.utils.data.TensorDataset(tokens, labels))
    raise ValueError("unknown model %r (cnn or embed)" % name)


def timed_steps(model, optimizer, loss_fn, loader, warmup, steps, new_epoch=lambda epoch: None):
    """The usual training loop over as many epochs as it takes: `warmup` steps, then `steps`
    timed ones. Returns the last loss and the seconds the timed steps took."""
    step, epoch, start, total = 0, 0, None, warmup + steps
    while step < total:
        new_epoch(epoch)
        epoch += 1
        for data, target in loader:
            if step == warmup:
                start = time.perf_counter()
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            optimizer.step()
            step += 1
            if step == total:
                break
    return loss, time.perf_counter() - start


def add_arguments(p):
    p.add_argument("--model", choices=("cnn", "embed"), default="cnn")
    p.add_argument("--steps", type=int, default=100, help="steps timed")
    p.add_argument("--warmup", type=int, default=5, help="steps run before the timing starts")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--samples", type=int, default=8192, help="size of the synthetic dataset")
    p.add_argument("--seed", type=int, default=1)
