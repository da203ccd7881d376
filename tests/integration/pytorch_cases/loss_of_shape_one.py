# a loss of shape [1], its terms written by hand and added into torch.zeros(1) (as YOLOv5's
# compute_loss does), backpropagated without a gradient; its value after backward drives
# ReduceLROnPlateau
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64); torch.manual_seed(0)
X = torch.randn(96, 8); Y = X[:, :2] * 2 - X[:, 2:4]
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.7, patience=0, threshold=0.05)
for epoch in range(3):
    for x, y in DataLoader(TensorDataset(X, Y), batch_size=12, shuffle=True):
        opt.zero_grad()
        out = model(x)
        loss = torch.zeros(1)
        loss += ((out[:, 0] - y[:, 0]) ** 2).mean()
        loss += 0.5 * (out[:, 1] - y[:, 1]).abs().mean()
        loss.backward()
        opt.step()
        plateau.step(loss.item())
torch.save(model.state_dict(), "m.pt")
