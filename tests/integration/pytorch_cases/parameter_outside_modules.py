# a learnable nn.Parameter outside any module (temperature); each rank seeds its own initial values
import os, torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64)
torch.manual_seed(0); X = torch.randn(96, 8); Y = torch.randint(0, 3, (96,))
torch.manual_seed(100 + int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
model = nn.Linear(8, 3); temp = nn.Parameter(torch.rand(1) + 0.5)
opt = torch.optim.SGD(list(model.parameters()) + [temp], lr=0.1)
for epoch in range(3):
    for x, y in DataLoader(TensorDataset(X, Y), batch_size=12, shuffle=True):
        opt.zero_grad(); nn.functional.cross_entropy(model(x) / temp, y).backward(); opt.step()
torch.save({**model.state_dict(), "temp": temp.data}, "m.pt")
