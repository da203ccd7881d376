# one loader used to train and to evaluate; a validation pass inside the training loop; eval mode
# with gradients on; len(loader) read during each pass
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64); torch.manual_seed(0)
data = TensorDataset(torch.randn(90, 5), torch.randn(90, 1))
loader = DataLoader(data, batch_size=20, shuffle=True)  # used to train and to evaluate
val = DataLoader(TensorDataset(torch.randn(33, 5), torch.randn(33, 1)), batch_size=8)
model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)

def measure(what, loader):
    total, n = 0.0, 0
    for x, y in loader:
        total += F.mse_loss(model(x), y, reduction="sum").item()
        n += len(x)
    print("%s: %d samples in %d batches (len %d), loss %.9f" % (what, n, -(-n // loader.batch_size), len(loader), total / n))

for epoch in range(2):
    model.train(); seen = 0
    for step, (x, y) in enumerate(loader):
        opt.zero_grad(); F.mse_loss(model(x), y).backward(); opt.step(); seen += len(x)
        if step == 2:  # validation inside the training loop
            with torch.no_grad():
                measure("validation under no_grad", val)
    print("epoch %d: trained on %d samples here" % (epoch, seen))
    with torch.no_grad():
        measure("the training loader under no_grad", loader)
    model.eval()
    measure("eval mode, gradients on", val)
# fine-tuning with the model in eval mode: a new loader's first pass looks like an evaluation
# (taken whole), the passes after it, having run backward, are training again (sharded)
tune = DataLoader(data, batch_size=30, shuffle=True)
model.eval()
for epoch in range(2):
    seen = 0
    for x, y in tune:
        opt.zero_grad(); F.mse_loss(model(x), y).backward(); opt.step(); seen += len(x)
    print("fine-tuning epoch %d: trained on %d samples here" % (epoch, seen))
torch.save(model.state_dict(), "m.pt")
