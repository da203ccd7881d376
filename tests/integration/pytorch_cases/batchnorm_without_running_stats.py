# BatchNorm1d(track_running_stats=False), model.eval() on steps 3-5 of each epoch (batch stats are still used in eval)
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64); torch.manual_seed(0)
X = torch.randn(96, 8); Y = torch.randn(96, 1)
model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16, track_running_stats=False), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for i, (x, y) in enumerate(DataLoader(TensorDataset(X, Y), batch_size=12, shuffle=True)):
        model.train(not (3 <= i < 6))
        opt.zero_grad(); nn.functional.mse_loss(model(x), y).backward(); opt.step()
torch.save(model.state_dict(), "m.pt")
