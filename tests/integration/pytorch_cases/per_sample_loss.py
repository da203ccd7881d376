# per-sample losses (reduction='none') weighted by hand; the last batch's backpropagated as they
# are, with the weights as their gradient. 99 samples in batches of 12: the last batch of 3 leaves
# a rank a share of one sample at np=2 (a loss of one element there, of two on the other) and
# every rank one at np=3
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64); torch.manual_seed(0)
X = torch.randn(99, 6); Y = (X[:, 0] + X[:, 1] > 0).long()
model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for epoch in range(3):
    for x, y in DataLoader(TensorDataset(X, Y), batch_size=12):
        opt.zero_grad()
        per_sample = nn.functional.cross_entropy(model(x), y, reduction="none")
        weights = 1.0 + (y == 1).double()
        if len(x) < 12:
            per_sample.backward(weights / len(x))
        else:
            (weights * per_sample).mean().backward()
        opt.step()
torch.save(model.state_dict(), "m.pt")
