# Datasets that seed per sample, fetched in the loop's process (num_workers=0): torchvision's
# FakeData makes sample i under torch.manual_seed(i + offset) and restores the generator after;
# an augmentation seeds Python's random and torch by the index and draws its noise. Each rank
# fetches its own share, so each seeding call must keep its own index, and the seeding must not
# part the ranks' generators after the fetch (draws.pt: what they draw after training). Argument:
# the FakeData loader's batch size (6).
import random
import sys
import torch, torch.nn as nn, torchvision
from torch.utils.data import DataLoader, Dataset
torch.set_default_dtype(torch.float64)
torch.manual_seed(0)


class Jittered(Dataset):
    def __len__(self):
        return 30

    def __getitem__(self, i):
        random.seed(1000 + i)
        torch.manual_seed(1000 + i)
        x = torch.linspace(-1, 1, 6) * (i % 7) + 0.1 * torch.randn(6) + random.random()
        return x, x[:2].sum(0, keepdim=True)


fake = torchvision.datasets.FakeData(size=40, image_size=(1, 3, 3), num_classes=3,
                                     transform=torchvision.transforms.ToTensor())
model = nn.Sequential(nn.Flatten(), nn.Linear(9, 3))
head = nn.Linear(6, 1)
opt = torch.optim.SGD(list(model.parameters()) + list(head.parameters()), lr=0.1, momentum=0.9)
order = torch.Generator().manual_seed(5)  # the dataset reseeds the global one: its order is its own
for epoch in range(2):
    for (x, y), (u, v) in zip(DataLoader(fake, batch_size=int(sys.argv[1]) if sys.argv[1:] else 6, shuffle=True, generator=order), DataLoader(Jittered(), batch_size=6)):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x.double()), y) + nn.functional.mse_loss(head(u), v)
        loss.backward()
        opt.step()
torch.save({"torch": torch.rand(4), "random": torch.tensor([random.random()])}, "draws.pt")
torch.save({**model.state_dict(), **{"head." + k: t for k, t in head.state_dict().items()}}, "m.pt")
