"""An ordinary single-GPU PyTorch script (nothing of dpshim in it), for the GPU check: run alone
and under mpirun with the shim, the saved weights must agree up to float rounding."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

# TF32 would round matmuls and convolutions to 10 bits: alone and distributed compare with a
# tolerance, so both compute in full float32
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(1)
x = torch.randn(2048, 1, 16, 16)
y = (x.mean(dim=(1, 2, 3)) > 0).long() + 2 * (x[:, 0, 0, 0] > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                      nn.Linear(8 * 14 * 14, 4)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(args.epochs):
    for xb, yb in loader:
        xb, yb = xb.to("cuda"), yb.to("cuda")
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    print("epoch %d loss %.6f" % (epoch, loss.item()))
torch.save({k: v.cpu() for k, v in model.state_dict().items()}, args.out)
