# no torch.optim: manual SGD update under no_grad (as in the PyTorch "learning by example" tutorials)
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64); torch.manual_seed(0)
X = torch.randn(96, 8); Y = torch.randn(96, 1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
for epoch in range(3):
    for x, y in DataLoader(TensorDataset(X, Y), batch_size=12, shuffle=True):
        model.zero_grad(); nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters(): p -= 0.1 * p.grad
torch.save(model.state_dict(), "m.pt")
