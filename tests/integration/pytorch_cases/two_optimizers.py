# two optimizers over disjoint parameter groups (SGD + Adam)
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64); torch.manual_seed(0)
X = torch.randn(96, 8); Y = torch.randn(96, 1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
o1 = torch.optim.SGD(model[0].parameters(), lr=0.05, momentum=0.9)
o2 = torch.optim.Adam(model[2].parameters(), lr=0.01)
for epoch in range(3):
    for x, y in DataLoader(TensorDataset(X, Y), batch_size=12, shuffle=True):
        o1.zero_grad(); o2.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        o1.step(); o2.step()
torch.save(model.state_dict(), "m.pt")
