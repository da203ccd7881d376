#!/usr/bin/env python3
# torch.multiprocessing beside training: a spawned process fills a shared tensor, a Pool of forked
# workers preprocesses the raw samples (with a module's forward), and a DataLoader with two worker
# processes feeds the training loop. None of these children trains.
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_default_dtype(torch.float64)


def fill_noise(shared, seed):
    g = torch.Generator().manual_seed(seed)
    shared.copy_(0.1 * torch.randn(shared.shape, generator=g))


projection = None


def preprocess(chunk):
    with torch.no_grad():
        return torch.tanh(projection(chunk))


def main():
    global projection
    torch.manual_seed(7)
    raw = torch.randn(480, 12)
    labels = (raw[:, :3].sum(1) > 0).long() + (raw[:, 3] > 0.5).long()
    projection = nn.Linear(12, 16)

    noise = torch.zeros(480, 16).share_memory_()
    p = mp.get_context('spawn').Process(target=fill_noise, args=(noise, 42))
    p.start()
    with mp.Pool(2) as pool:
        features = torch.cat(pool.map(preprocess, raw.split(60)))
    p.join()
    features += noise
    print('features: mean {:.8f} std {:.8f}'.format(features.mean().item(), features.std().item()))

    train_loader = DataLoader(TensorDataset(features[:400], labels[:400]), batch_size=40, shuffle=True,
                              num_workers=2, persistent_workers=True)
    test_loader = DataLoader(TensorDataset(features[400:], labels[400:]), batch_size=40, num_workers=2, persistent_workers=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(1, 4):
        model.train()
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
        model.eval()
        correct, total_loss = 0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                total_loss += F.cross_entropy(output, target, reduction='sum').item()
                correct += (output.argmax(1) == target).sum().item()
        print('epoch {}: last train loss {:.8f}, test loss {:.8f}, accuracy {}/{}'.format(
            epoch, loss.item(), total_loss / len(test_loader.dataset), correct, len(test_loader.dataset)))
    torch.save(model.state_dict(), 'model.pt')


if __name__ == '__main__':
    main()
