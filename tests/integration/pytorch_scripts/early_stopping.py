#!/usr/bin/env python3
# Early stopping on the validation loss: the best model so far is saved to best.pt, training
# stops after `patience` epochs without improvement, and best.pt is reloaded for the test.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_default_dtype(torch.float64)


def make_data(n):
    x = torch.rand(n, 3) * 4 - 2
    y = torch.sin(x[:, :1]) * x[:, 1:2] + 0.5 * x[:, 2:] ** 2 + 0.3 * torch.randn(n, 1)
    return TensorDataset(x, y)


train_loader = DataLoader(make_data(160), batch_size=16, shuffle=True)
val_loader = DataLoader(make_data(100), batch_size=64)
test_loader = DataLoader(make_data(200), batch_size=64)

model = nn.Sequential(nn.Linear(3, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
criterion = nn.MSELoss()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)


def evaluate(loader):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += criterion(model(x), y).item() * len(x)
    return total / len(loader.dataset)


best = float('inf')
patience = 3
for epoch in range(1, 61):
    model.train()
    running = 0.0
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running += loss.item()
    val_loss = evaluate(val_loader)
    print('epoch {:2d}  train loss {:.6f}  val loss {:.6f}'.format(epoch, running / len(train_loader), val_loss))
    if val_loss < best:
        best = val_loss
        torch.save(model.state_dict(), 'best.pt')
    else:
        patience -= 1
        if patience == 0:
            print('early stop at epoch {}'.format(epoch))
            break

model.load_state_dict(torch.load('best.pt'))
print('best val loss {:.6f}  test loss {:.6f}'.format(best, evaluate(test_loader)))
