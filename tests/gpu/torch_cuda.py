"""An ordinary single-GPU PyTorch script (nothing of dpshim in it), for the GPU check: run alone
and under mpirun with the shim, the saved weights must agree up to float rounding. --opt adam
--wide: Adam on a model with a 6.4M-parameter layer, for [optim] shard (sharded and unsharded
runs must save the same bytes); prints this process's peak GPU memory and optimizer state."""
import argparse
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic mode
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--opt", choices=("sgd", "adam"), default="sgd")
parser.add_argument("--wide", action="store_true")
args = parser.parse_args()

# TF32 would round matmuls and convolutions to 10 bits: alone and distributed compare with a
# tolerance, so both compute in full float32
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
# cuDNN's convolution backward may sum in any order: two runs alone differ, and [optim] shard on
# and off are compared bit for bit, so the kernels are the deterministic ones
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
torch.use_deterministic_algorithms(True, warn_only=True)
torch.manual_seed(1)
x = torch.randn(2048, 1, 16, 16)
y = (x.mean(dim=(1, 2, 3)) > 0).long() + 2 * (x[:, 0, 0, 0] > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
head = ([nn.Linear(8 * 14 * 14, 4096), nn.ReLU(), nn.Linear(4096, 4)] if args.wide else [nn.Linear(8 * 14 * 14, 4)])
model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), *head).cuda()
opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if args.opt == "adam"
       else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
for epoch in range(args.epochs):
    for xb, yb in loader:
        xb, yb = xb.to("cuda"), yb.to("cuda")
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    print("epoch %d loss %.6f" % (epoch, loss.item()))
torch.save({k: v.cpu() for k, v in model.state_dict().items()}, args.out)
state = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
print("peak GPU memory %.1f MiB, optimizer state %.1f MiB" % (torch.cuda.max_memory_allocated() / 2**20, state / 2**20))
