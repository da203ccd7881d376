#!/usr/bin/env python3
# pytorch/examples' VAE on synthetic 8x8 images: a loss summed over the batch
# (binary_cross_entropy with reduction='sum') plus a KL term written by hand with torch.sum, and an
# "Average loss" per epoch that sums loss.item() over the script's own batches and divides by the
# data set's length. --mixed adds a mean-reduced term (an MSE with the default reduction);
# --per-sample divides the loss by the batch's length before backward, with SGD (whose step,
# unlike Adam's, shows a gradient N times too large).
import argparse

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset


class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc21 = nn.Linear(32, 4)
        self.fc22 = nn.Linear(32, 4)
        self.fc3 = nn.Linear(4, 32)
        self.fc4 = nn.Linear(32, 64)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        return mu + 0.1 * std  # deterministic: the run alone and the ranks draw nothing

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar, mixed):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction='sum')
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    if mixed:
        return BCE + KLD + F.mse_loss(recon_x, x.view(-1, 64))
    return BCE + KLD


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--mixed', action='store_true')
    parser.add_argument('--per-sample', action='store_true')
    args = parser.parse_args()
    torch.manual_seed(1)
    torch.set_default_dtype(torch.float64)
    g = torch.Generator().manual_seed(2)
    train_set = TensorDataset(torch.rand(300, 1, 8, 8, generator=g), torch.zeros(300))
    test_set = TensorDataset(torch.rand(100, 1, 8, 8, generator=g), torch.zeros(100))
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=32)
    model = VAE()
    optimizer = optim.SGD(model.parameters(), lr=1e-3) if args.per_sample else optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(1, 4):
        model.train()
        train_loss = 0
        for batch_idx, (data, _) in enumerate(train_loader):
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(data)
            loss = loss_function(recon_batch, data, mu, logvar, args.mixed)
            if args.per_sample:
                loss = loss / len(data)
            loss.backward()
            train_loss += loss.item()
            optimizer.step()
            if batch_idx % 4 == 0:
                print('Train Epoch: {} [{}/{}]\tLoss: {:.6f}'.format(
                    epoch, batch_idx * len(data), len(train_loader.dataset), loss.item() / len(data)))
        print('====> Epoch: {} Average loss: {:.4f}'.format(epoch, train_loss / len(train_loader.dataset)))
        model.eval()
        test_loss = 0
        with torch.no_grad():
            for data, _ in test_loader:
                recon_batch, mu, logvar = model(data)
                test_loss += loss_function(recon_batch, data, mu, logvar, args.mixed).item()
        print('====> Test set loss: {:.4f}'.format(test_loss / len(test_loader.dataset)))
    torch.save(model.state_dict(), 'model.pt')


if __name__ == "__main__":
    main()
