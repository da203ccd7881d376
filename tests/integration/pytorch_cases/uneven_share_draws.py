# Input noise drawn per sample (a share-sized draw) in batches of 10, which 3 ranks share as 4, 3
# and 3, then a choice drawn once per step at the start of the next (a head used on some steps):
# every rank must make the same choices. Saves the choices and the weights (m.pt).
import torch
torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
ds = torch.utils.data.TensorDataset(torch.randn(40, 2), torch.randn(40, 1))
model, extra = torch.nn.Linear(2, 1), torch.nn.Linear(1, 1)
opt = torch.optim.SGD(list(model.parameters()) + list(extra.parameters()), lr=0.1)
choices = []
for epoch in range(2):
    for x, y in torch.utils.data.DataLoader(ds, batch_size=10):
        choices.append(bool(torch.rand(()) < 0.5))
        out = model(x + 0.01 * torch.randn_like(x))
        if choices[-1]:
            out = out + extra(out)
        loss = torch.nn.functional.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
torch.save({"choices": torch.tensor(choices), **model.state_dict()}, "m.pt")
