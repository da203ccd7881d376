# LBFGS with a closure (strong_wolfe line search), full-batch
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64); torch.manual_seed(0)
X = torch.randn(96, 8); Y = torch.randn(96, 1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=10, history_size=5, line_search_fn="strong_wolfe")
for epoch in range(4):
    for x, y in DataLoader(TensorDataset(X, Y), batch_size=48, shuffle=True):
        def closure():
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        opt.step(closure)
print("batch", len(x))
torch.save(model.state_dict(), "m.pt")
