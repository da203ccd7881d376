#!/usr/bin/env python3
# An MNIST-example-style classifier on synthetic 8x8 "digits": a shuffling DataLoader, a
# validation pass every epoch and a test pass at the end that count correct predictions.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.fc1 = nn.Linear(8 * 3 * 3, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def synthetic_digits(n, prototypes, generator):
    target = torch.randint(0, 10, (n,), generator=generator)
    data = prototypes[target] + 2.5 * torch.randn(n, 1, 8, 8, generator=generator, dtype=torch.float64)
    return TensorDataset(data, target)


def train(args, model, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx, len(train_loader), 100. * batch_idx / len(train_loader), loss.item()))


def test(model, test_loader, name='Test'):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    print('{} set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)'.format(
        name, test_loss, correct, len(test_loader.dataset), 100. * correct / len(test_loader.dataset)))
    return test_loss


def main():
    parser = argparse.ArgumentParser(description='Synthetic digits example')
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--test-batch-size', type=int, default=100)
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--lr', type=float, default=0.05)
    parser.add_argument('--momentum', type=float, default=0.9)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--log-interval', type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data_gen = torch.Generator().manual_seed(1234)
    prototypes = 1.5 * torch.randn(10, 1, 8, 8, generator=data_gen, dtype=torch.float64)
    train_set = synthetic_digits(512, prototypes, data_gen)
    val_set = synthetic_digits(150, prototypes, data_gen)
    test_set = synthetic_digits(250, prototypes, data_gen)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=args.test_batch_size)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size)

    model = Net().double()
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    for epoch in range(1, args.epochs + 1):
        train(args, model, train_loader, optimizer, epoch)
        test(model, val_loader, 'Validation')
    test(model, test_loader)


if __name__ == '__main__':
    main()
