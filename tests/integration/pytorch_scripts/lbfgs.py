#!/usr/bin/env python3
# Full-batch LBFGS on a small regression (as pytorch/examples' time_sequence_prediction trains):
# the closure prints the loss before its backward pass; the test loss is printed per step.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(3)
torch.set_default_dtype(torch.float64)

x = torch.linspace(-3, 3, 240).unsqueeze(1)
y = torch.sin(2 * x) + 0.1 * x ** 2 + 0.05 * torch.randn_like(x)
perm = torch.randperm(len(x))
train = DataLoader(TensorDataset(x[perm[:200]], y[perm[:200]]), batch_size=200)
test_x, test_y = x[perm[200:]], y[perm[200:]]

model = nn.Sequential(nn.Linear(1, 20), nn.Tanh(), nn.Linear(20, 20), nn.Tanh(), nn.Linear(20, 1))
criterion = nn.MSELoss()
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.8, max_iter=10)

for i in range(6):
    print('STEP: ', i)
    for inputs, targets in train:
        def closure():
            optimizer.zero_grad()
            out = model(inputs)
            loss = criterion(out, targets)
            print('loss: {:.10f}'.format(loss.item()))
            loss.backward()
            return loss
        optimizer.step(closure)
    with torch.no_grad():
        pred = model(test_x)
        loss = criterion(pred, test_y)
        print('test loss: {:.10f}'.format(loss.item()))

torch.save(model.state_dict(), 'model.pt')
