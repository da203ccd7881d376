"""A plain single-process PyTorch trainer for Fashion-MNIST, in the style of PyTorch's MNIST
example. It knows nothing of dpshim: `mpirun -np N env LD_PRELOAD=libdpshim.so python3
train_fmnist.py` makes it data-parallel (docs/pytorch.md)."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torchvision import datasets, transforms


class Net(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, bias=False)  # BatchNorm follows: a bias would cancel out
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.drop = nn.Dropout(0.25) if dropout else nn.Identity()
        self.fc1 = nn.Linear(32 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.drop(torch.flatten(x, 1))
        x = self.drop(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def main():
    p = argparse.ArgumentParser(description="Fashion-MNIST with PyTorch")
    p.add_argument("--data", default="data", help="torchvision root holding FashionMNIST/raw")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training samples")
    p.add_argument("--dropout", action="store_true")
    p.add_argument("--clip", type=float, default=0.0, help="clip the gradient norm to this (0: no clipping)")
    p.add_argument("--double", action="store_true", help="train in float64")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--save", default="", help="write the model's state_dict here at the end")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    if args.double:
        torch.set_default_dtype(torch.float64)
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])
    train = datasets.FashionMNIST(args.data, train=True, download=False, transform=tf)
    if args.train_limit:
        train = torch.utils.data.Subset(train, range(args.train_limit))
    loader = torch.utils.data.DataLoader(train, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)

    model = Net(args.dropout)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    step = 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        total, batches = 0.0, 0
        for data, target in loader:
            data = data.to(torch.get_default_dtype())
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            if args.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
            total, batches, step = total + loss.item(), batches + 1, step + 1
            if step % 100 == 0:
                print("step %d: loss %.4f" % (step, loss.item()), flush=True)
            if args.steps and step >= args.steps:
                break
        scheduler.step()
        print("epoch %d: %d batches of %d, mean loss %.4f" % (epoch, batches, len(loader), total / max(batches, 1)),
              flush=True)
        if args.steps and step >= args.steps:
            break
    if not args.no_eval:
        test = datasets.FashionMNIST(args.data, train=False, download=False, transform=tf)
        model.eval()
        correct = 0
        with torch.no_grad():
            for data, target in torch.utils.data.DataLoader(test, batch_size=1000):
                data = data.to(torch.get_default_dtype())
                correct += (model(data).argmax(dim=1) == target).sum().item()
        print("test accuracy %.2f%%" % (100.0 * correct / len(test)), flush=True)
    if args.save:
        torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
