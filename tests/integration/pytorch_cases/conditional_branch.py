# a branch (its own Linear) used only on even steps; zero_grad(set_to_none=True); Adam
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64); torch.manual_seed(0)
X = torch.randn(96, 8); Y = torch.randn(96, 1)
body, head, extra = nn.Linear(8, 16), nn.Linear(16, 1), nn.Linear(16, 16)
params = list(body.parameters()) + list(head.parameters()) + list(extra.parameters())
opt = torch.optim.Adam(params, lr=0.01)
step = 0
for epoch in range(3):
    for x, y in DataLoader(TensorDataset(X, Y), batch_size=12, shuffle=True):
        opt.zero_grad(set_to_none=True)
        h = torch.tanh(body(x))
        if step % 2 == 0: h = h + torch.tanh(extra(h))
        nn.functional.mse_loss(head(h), y).backward()
        opt.step(); step += 1
torch.save({**{"b." + k: v for k, v in body.state_dict().items()}, **{"h." + k: v for k, v in head.state_dict().items()},
            **{"e." + k: v for k, v in extra.state_dict().items()}}, "m.pt")
