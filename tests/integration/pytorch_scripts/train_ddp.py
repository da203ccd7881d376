"""A script that is already data-parallel, as the PyTorch DDP tutorial writes one: the process
group over gloo (rank and size from Open MPI's launcher, the rendezvous on MASTER_ADDR and
MASTER_PORT), a DistributedSampler, DistributedDataParallel, SGD with momentum; rank 0 saves the
weights. Under dpshim it must give what it gives without dpshim, bit for bit."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % os.environ["MASTER_PORT"], rank=rank,
                        world_size=size)
torch.manual_seed(0)
x = torch.randn(720, 12, dtype=torch.float64)
y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 0.5).long()
data = TensorDataset(x, y)
sampler = DistributedSampler(data, shuffle=True, seed=3)
loader = DataLoader(data, batch_size=24, sampler=sampler)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3)).double())
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
seen = 0
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        seen += len(xb)
    print("epoch %d loss %.12f" % (epoch, loss.item()))
print("samples seen by this rank", seen)
if rank == 0:
    torch.save(model.module.state_dict(), args.out)
dist.destroy_process_group()
