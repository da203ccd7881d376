# a parameter stored transposed (non-contiguous, 256 KiB): dp_params sees it through a copy, which
# the drift check ([guard] drift_every) must not read after it was freed
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64)
torch.manual_seed(0); X = torch.randn(96, 64); Y = torch.randint(0, 3, (96,))
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(512, 64).t() * 0.05)  # 64 x 512, stored transposed
        self.out = nn.Linear(512, 3)
    def forward(self, x):
        return self.out(torch.tanh(x @ self.w))
model = Net()
assert not model.w.is_contiguous()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in DataLoader(TensorDataset(X, Y), batch_size=12, shuffle=True):
        opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
torch.save(model.state_dict(), "m.pt")
