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


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm, and a 1x1 convolution with
    BatchNorm on the shortcut where the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18's layout (a stem, four stages of two basic blocks, 20 BatchNorm layers) at a
    quarter of its width (16 to 128 channels, 0.7M parameters) on 28x28 one-channel inputs: the
    many-BatchNorm case at a size one CPU core trains."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        blocks, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2), (128, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return F.log_softmax(self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)), dim=1)


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
    """(model, optimizer factory, loss function, dataset) for `cnn`, `resnet` (both SGD with
    momentum), `embed` (Adam) or `embed_sgd`
    (the same model with SGD and momentum, whose update is cheap, so the step is mostly
    gradients and their all-reduce); the data comes
    from a generator of its own, so every process builds the same dataset whatever it seeded."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (samples,), generator=g)
    if name == "cnn":
        data = torch.randn(samples, 1, 28, 28, generator=g)
        return (ConvNet(), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), F.nll_loss,
                torch.utils.data.TensorDataset(data, labels))
    if name == "resnet":
        data = torch.randn(samples, 1, 28, 28, generator=g)
        return (ResNet18(), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), F.nll_loss,
                torch.utils.data.TensorDataset(data, labels))
    if name in ("embed", "embed_sgd"):
        tokens = torch.randint(0, VOCAB, (samples, TOKENS), generator=g)
        optimizer = ((lambda ps: torch.optim.Adam(ps, lr=1e-3)) if name == "embed"
                     else (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)))
        return (EmbedNet(), optimizer, F.cross_entropy, torch.utils.data.TensorDataset(tokens, labels))
    raise ValueError("unknown model %r (cnn, embed or embed_sgd)" % name)


def timed_steps(model, optimizer, loss_fn, loader, warmup, steps, new_epoch=lambda epoch: None, phases=None):
    """The usual training loop over as many epochs as it takes: `warmup` steps, then `steps`
    timed ones. Returns the last loss and the seconds the timed steps took; a dict given as
    `phases` gets, for each part of the timed steps (the loader's next batch, zero_grad, forward
    with the loss, backward, the optimizer's step), the seconds it took on the clock and in this
    thread's CPU time: (wall, cpu). Their difference is time off the CPU: waiting in a blocking
    call, or for a core."""
    step, epoch, start, total = 0, 0, None, warmup + steps

    def mark(marks):
        marks.append((time.perf_counter(), time.thread_time()))

    while step < total:
        new_epoch(epoch)
        epoch += 1
        batches = iter(loader)
        while True:
            if step == warmup:
                start = time.perf_counter()
            marks = []
            mark(marks)
            batch = next(batches, None)
            if batch is None:
                break
            data, target = batch
            mark(marks)
            optimizer.zero_grad()
            mark(marks)
            loss = loss_fn(model(data), target)
            mark(marks)
            loss.backward()
            mark(marks)
            optimizer.step()
            mark(marks)
            if phases is not None and step >= warmup:
                for name, t0, t1 in zip(PHASES, marks, marks[1:]):
                    wall, cpu = phases.get(name, (0.0, 0.0))
                    phases[name] = (wall + t1[0] - t0[0], cpu + t1[1] - t0[1])
            step += 1
            if step == total:
                break
    return loss, time.perf_counter() - start


PHASES = ("data", "zero_grad", "forward", "backward", "step")


def print_phases(phases, steps, who):
    """Milliseconds per step of each part of the timed steps (--phases): one line on the clock,
    one in this thread's CPU time."""
    for i, clock in enumerate(("wall", "cpu")):
        print("%s phases, ms per step (%s): %s" % (who, clock, "  ".join(
            "%s %.1f" % (k, 1000 * phases[k][i] / steps) for k in PHASES if k in phases)), flush=True)


def print_memory(optimizer):
    """This process's peak resident memory, and what its optimizer keeps as state (its own
    tensors: a sharded optimizer keeps its share only), in MiB."""
    import resource
    state = sum(v.numel() * v.element_size() for st in optimizer.state.values() for v in st.values()
                if isinstance(v, torch.Tensor))
    print("peak_rss_mb %.0f" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    print("optim_state_mb %.1f" % (state / 2**20), flush=True)


def add_arguments(p):
    p.add_argument("--model", choices=("cnn", "resnet", "embed", "embed_sgd"), default="cnn")
    p.add_argument("--steps", type=int, default=100, help="steps timed")
    p.add_argument("--warmup", type=int, default=5, help="steps run before the timing starts")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--samples", type=int, default=8192, help="size of the synthetic dataset")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--phases", action="store_true",
                   help="print the time per step of zero_grad, forward with the loss, backward and the optimizer step")
