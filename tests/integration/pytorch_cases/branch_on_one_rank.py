# rank 1 takes another head at step 1: its backward reaches other parameters than rank 0's (the
# batches come from a DataLoader: each rank holds a share, so [comm] overlap announces gradients)
import os, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
a = nn.Linear(4, 4); b = nn.Linear(4, 1); c = nn.Linear(4, 1)
opt = torch.optim.SGD(list(a.parameters()) + list(b.parameters()) + list(c.parameters()), lr=0.1)
x = torch.randn(8, 4); y = torch.randn(8, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
c(a(x))  # every module ran forward once
for step in range(3):
    for xb, yb in loader:
        opt.zero_grad()
        h = a(xb)
        out = c(h) if (step == 1 and os.environ.get("OMPI_COMM_WORLD_RANK") == "1") else b(h)
        F.mse_loss(out, yb).backward()
        opt.step()
print("done", a.weight.sum().item())
