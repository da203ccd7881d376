# a sweep whose trainer object refers to itself (a callback that is its own bound method): each
# old trainer, model and optimizer live on after the name is rebound, until the garbage collector
# runs. When it runs depends on each process's allocations; the ranks other than 0 collect here,
# as if theirs had made it run there.
import gc
import os
import torch, torch.nn as nn
from torch.utils.data import TensorDataset, DataLoader
torch.set_default_dtype(torch.float64)
X = torch.randn(96, 8, generator=torch.Generator().manual_seed(1)); Y = X[:, :1] * 2 - X[:, 1:2]
elsewhere = os.environ.get("OMPI_COMM_WORLD_RANK", "0") != "0"


class Trainer:
    def __init__(self, lr):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.after_step = self.count  # a reference to itself
        self.steps = 0

    def count(self):
        self.steps += 1

    def epoch(self):
        loader = DataLoader(TensorDataset(X, Y), batch_size=24, shuffle=True)
        print("steps", len(loader))  # before the first forward: the old model, in eval mode, is gone
        self.model.train()
        for x, y in loader:
            self.opt.zero_grad()
            self.loss = nn.functional.mse_loss(self.model(x), y)
            self.loss.backward()
            self.opt.step()
            self.after_step()
        self.model.eval()
        return self.loss.item()


best = None
for lr in (0.1, 0.03, 0.01):
    trainer = Trainer(lr)  # the last trainer is garbage now, not yet collected
    if elsewhere:
        gc.collect()
    loss = trainer.epoch()
    if best is None or loss < best[0]:
        best = (loss, {k: v.clone() for k, v in trainer.model.state_dict().items()})
torch.save(best[1], "m.pt")
