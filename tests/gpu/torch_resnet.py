"""An ordinary single-GPU PyTorch training script (nothing of dpshim in it), for the GPU
comparison of `./dev.sh gpu-check bench`: a ResNet-18-like network (torchvision's resnet18 for
32x32 images: a 3x3 stem, four stages of two BasicBlocks, 20 BatchNorm layers; --width 64 is
ResNet-18's, with 11M parameters) trained with SGD and momentum on synthetic images through a
DataLoader. Run alone, and unmodified under `mpirun ... env LD_PRELOAD=libdpshim.so`;
torch_resnet_ddp.py is the same script converted to DistributedDataParallel. --device cpu runs it
on the CPU (the CI test of both scripts).

Prints `samples_per_s X` (this process's: its batch times its steps per second, over the timed
steps), `step_ms X` and `grad_mib X` (the gradients reduced per step, in MiB)."""

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, width=64, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        layers, cin = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            cout = width * 2**i
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def add_arguments(p):
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--width", type=int, default=64, help="channels of the first stage (ResNet-18: 64)")
    p.add_argument("--image", type=int, default=32, help="image side in pixels")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--samples", type=int, default=4096, help="synthetic images in the dataset")
    p.add_argument("--warmup", type=int, default=5, help="steps before the clock starts")
    p.add_argument("--steps", type=int, default=30, help="steps timed")
    p.add_argument("--seed", type=int, default=1)


def build(args):
    """The model on its device, its optimizer, and the dataset (on the host, as a loader gets it):
    drawn from a generator of its own, so every process holds the same images."""
    g = torch.Generator().manual_seed(args.seed)
    images = torch.randn(args.samples, 3, args.image, args.image, generator=g)
    labels = torch.randint(0, 10, (args.samples,), generator=g)
    model = ResNet18(args.width).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    return model, optimizer, torch.utils.data.TensorDataset(images, labels)


def train(model, optimizer, loader, args, new_epoch=lambda epoch: None):
    """--warmup steps, then --steps timed ones, over as many epochs as it takes; the clock is
    read after the GPU finished. Returns the last loss and the seconds of the timed steps."""
    cuda = args.device.startswith("cuda")
    step, epoch, start, total = 0, 0, None, args.warmup + args.steps
    model.train()
    while step < total:
        new_epoch(epoch)
        epoch += 1
        for images, labels in loader:
            if step == args.warmup:
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
            images, labels = images.to(args.device, non_blocking=True), labels.to(args.device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            step += 1
            if step == total:
                break
    if cuda:
        torch.cuda.synchronize()
    return loss, time.perf_counter() - start


def report(model, loss, seconds, args):
    grad_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    print("loss %.4f" % loss.item())
    print("samples_per_s %.1f" % (args.batch_size * args.steps / seconds))
    print("step_ms %.3f" % (1e3 * seconds / args.steps))
    print("grad_mib %.2f" % grad_mib, flush=True)


def main():
    p = argparse.ArgumentParser(description="train a ResNet-18-like network on synthetic images")
    add_arguments(p)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    model, optimizer, dataset = build(args)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    loss, seconds = train(model, optimizer, loader, args)
    report(model, loss, seconds, args)


if __name__ == "__main__":
    main()
