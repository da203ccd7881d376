#!/usr/bin/env python3
# An unseeded script: a seed chosen at random and printed (as pytorch/examples' DCGAN does), torch
# and numpy seeded from the clock and the process id, the data drawn with numpy and split at
# random, shuffled with Python's random, augmented with numpy noise, and a model with Dropout.
import os
import random
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset, random_split

manual_seed = random.randint(1, 10000)
print('Random Seed: ', manual_seed)
random.seed(manual_seed)
torch.manual_seed(int(time.time() * 1e6) % 2**31)
np.random.seed(os.getpid())

# synthetic data: two Gaussian blobs per class in 10 dimensions, overlapping a little
centers = np.random.randn(4, 10)
labels = np.array([0, 0, 1, 1])
which = np.random.randint(0, 4, size=600)
features = torch.from_numpy(centers[which] + np.random.randn(600, 10)).float()
targets = torch.from_numpy(labels[which])
train_set, val_set = random_split(TensorDataset(features, targets), [500, 100])
val_x, val_y = features[val_set.indices], targets[val_set.indices]

model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def validate():
    model.eval()
    with torch.no_grad():
        out = model(val_x)
        return F.cross_entropy(out, val_y).item(), (out.argmax(1) == val_y).sum().item()


print('initial val loss {:.4f}, {} correct'.format(*validate()))
order = list(range(len(train_set)))
for epoch in range(1, 6):
    random.shuffle(order)
    model.train()
    for start in range(0, len(order), 50):
        x, y = train_set[order[start:start + 50]]
        x = x + 0.1 * torch.from_numpy(np.random.randn(*x.shape)).float()  # augmentation noise
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    print('epoch {} train loss {:.4f} val loss {:.4f}, {} correct'.format(epoch, loss.item(), *validate()))

torch.save(model.state_dict(), 'model.pt')
