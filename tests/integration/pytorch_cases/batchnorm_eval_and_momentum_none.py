# BatchNorm1d(momentum=None) + BatchNorm2d(momentum=None) conv net; eval mode on steps 5-9 of each epoch
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64); torch.manual_seed(0)
X = torch.randn(101, 2, 6, 6); Y = torch.randint(0, 3, (101,))
model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4, momentum=None), nn.ReLU(), nn.Flatten(),
                      nn.Linear(64, 16), nn.BatchNorm1d(16, momentum=None), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for epoch in range(3):
    for i, (x, y) in enumerate(DataLoader(TensorDataset(X, Y), batch_size=11, shuffle=True)):
        model.train(not (5 <= i < 8))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
torch.save(model.state_dict(), "m.pt")
