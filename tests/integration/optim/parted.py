"""Scripts that part the ranks of a sharded optimizer ([optim] shard), for optim_shard.bats:
  parted.py relayout      a weight made non-contiguous after the first sharded step
  parted.py rank0-saves   optimizer.state_dict() asked for on rank 0 only (the script's own check)"""
import os, sys
import torch, torch.nn as nn, torch.nn.functional as F
model = nn.Linear(300, 40); opt = torch.optim.Adam(model.parameters(), lr=0.1)
x = torch.randn(8, 300); y = torch.randn(8, 40)
for step in range(3):
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.step()
    if sys.argv[1] == "relayout" and step == 0:  # the same values, transposed in memory
        model.weight.data = model.weight.data.t().contiguous().t()
    if sys.argv[1] == "rank0-saves" and os.environ.get("OMPI_COMM_WORLD_RANK") == "0":
        torch.save(opt.state_dict(), "opt.pt")
