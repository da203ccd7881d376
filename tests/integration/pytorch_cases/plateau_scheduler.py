# ReduceLROnPlateau fed with each epoch's mean training loss (loss.item()), as tutorials do
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64); torch.manual_seed(0)
X = torch.randn(96, 8); Y = torch.randn(96, 1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.3)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=0.05)
for epoch in range(8):
    total = 0.0
    for x, y in DataLoader(TensorDataset(X, Y), batch_size=12, shuffle=True):
        opt.zero_grad(); loss = nn.functional.mse_loss(model(x), y); loss.backward(); opt.step(); total += loss.item()
    sched.step(total)
    print("epoch", epoch, "loss %.6f" % total, "lr", opt.param_groups[0]["lr"], flush=True)
torch.save(model.state_dict(), "m.pt")
