# a branch that depends on the rank (here: the launcher's rank variable), taken at step 2 by rank 1
import os, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4); y = torch.randn(8, 1)
for step in range(5):
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    if step == 2 and os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
        print("rank 1 evaluates", F.mse_loss(model(x), y).item())
        F.mse_loss(model(x), y).backward()
    opt.step()
print("done")
