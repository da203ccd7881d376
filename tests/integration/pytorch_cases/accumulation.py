# gradient accumulation: 3 backward passes per optimizer step, SGD momentum
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64); torch.manual_seed(0)
X = torch.randn(120, 8); Y = torch.randn(120, 1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loader = DataLoader(TensorDataset(X, Y), batch_size=10, shuffle=True)
for epoch in range(3):
    opt.zero_grad()
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y) / 3
        loss.backward()
        if i % 3 == 2:
            opt.step(); opt.zero_grad()
torch.save(model.state_dict(), "m.pt")
