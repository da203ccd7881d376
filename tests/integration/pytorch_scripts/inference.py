#!/usr/bin/env python3
# Inference only: a seeded classifier in eval mode scores a synthetic data set through a
# DataLoader under torch.no_grad() and prints its accuracy and mean loss; nothing is trained.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(600, 20, dtype=torch.float64)
y = (x[:, :3].sum(dim=1) > 0).long()
model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2)).double()
model.eval()
correct, loss = 0, 0.0
with torch.no_grad():
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=64):
        out = model(xb)
        loss += F.cross_entropy(out, yb, reduction="sum").item()
        correct += (out.argmax(1) == yb).sum().item()
print("scored %d samples: accuracy %d/%d, mean loss %.6f" % (len(x), correct, len(x), loss / len(x)))
