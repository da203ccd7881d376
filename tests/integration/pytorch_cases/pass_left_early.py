# Passes left early (a step budget per epoch) over a loader shuffled by the script's own
# generator: alone, its RandomSampler draws the next permutation where its iterator ends, which
# a pass that breaks never reaches; a later pass over the whole epoch does.
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
X = torch.randn(40, 9); Y = (X[:, 0] > X[:, 1]).long()
model = nn.Linear(9, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
order = torch.Generator().manual_seed(5)
loader = DataLoader(TensorDataset(X, Y), batch_size=6, shuffle=True, generator=order)
for budget in (5, 7, 2, 7):
    for i, (x, y) in enumerate(loader):
        if i == budget:
            break
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
torch.save(model.state_dict(), "m.pt")
