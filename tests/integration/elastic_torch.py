"""A plain PyTorch training script (nothing of dpshim in it) for elastic.bats: a small MLP, SGD
(Adam with $OPT=adam), a shuffled DataLoader over 512 samples in batches of 64 ($WORKERS worker
processes, none by default; kept from epoch to epoch with $PERSISTENT set), 3 epochs.
- $ACCUMULATE=K: one optimizer step for every K batches (gradient accumulation), and at each
  epoch's last batch, unless $CARRY is set: then what is left is carried into the next step, the
  last one after the loop.
- $TWO_STEPS: two optimizers, each over half the parameters, each stepping every batch (as a
  GAN's two).
- The rank that started as $KILL_RANK (OMPI_COMM_WORLD_RANK) kills itself with SIGKILL before the
  forward pass of batch $KILL_STEP (5), counted over the whole run; $KILL_ALSO=RANK:STEP, another.
Prints the final loss and a sum of the parameters; with $SAVE, saves the model there after each
epoch (torch.save) and prints the sum of the parameters the file holds at the end; with $TRACE,
each rank appends the samples of each step it trained to $TRACE.<rank it started as>, a line
"EPOCH INDEX..." per step and epoch; with $PROGRESS, a line per epoch on stdout, "epoch E:" as it
begins and " done" as it ends."""
import os
import signal

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(20, 50), torch.nn.ReLU(), torch.nn.Linear(50, 2))

def optimizer(params):
    return (torch.optim.Adam(params, lr=0.01) if os.environ.get("OPT") == "adam" else
            torch.optim.SGD(params, lr=0.1, momentum=0.9))


opts = ([optimizer(model[0].parameters()), optimizer(model[2].parameters())] if "TWO_STEPS" in os.environ
        else [optimizer(model.parameters())])
accumulate = int(os.environ.get("ACCUMULATE", "1"))
X = torch.randn(512, 20)
Y = (X[:, 0] > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y, torch.arange(512)), batch_size=64,
                                     shuffle=True, num_workers=int(os.environ.get("WORKERS", "0")),
                                     persistent_workers="PERSISTENT" in os.environ)
kill, kill_step = int(os.environ.get("KILL_RANK", "-1")), int(os.environ.get("KILL_STEP", "5"))
kill_also = tuple(map(int, os.environ.get("KILL_ALSO", "-1:0").split(":")))
started_as = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
save = os.environ.get("SAVE")
trace = open(f"{os.environ['TRACE']}.{started_as}", "a") if "TRACE" in os.environ else None
step = 0
pending = {}  # the samples of the batches of the step under way, by epoch
for epoch in range(3):
    if "PROGRESS" in os.environ:
        print(f"epoch {epoch}:", end="")
    for n, (x, y, i) in enumerate(loader):
        step += 1
        if (started_as, step) in ((kill, kill_step), kill_also):
            os.kill(os.getpid(), signal.SIGKILL)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        (loss / accumulate).backward()
        pending.setdefault(epoch, []).extend(i.tolist())
        if (n + 1) % accumulate and ("CARRY" in os.environ or n + 1 < len(loader)):
            continue
        for opt in opts:
            opt.step()
            opt.zero_grad()
        if trace:
            for e, samples in pending.items():
                print(e, *samples, file=trace, flush=True)
        pending = {}
    if "PROGRESS" in os.environ:
        print(" done")
    if save:
        torch.save(model.state_dict(), save)
if pending:  # with $CARRY, the gradient left after the last epoch
    for opt in opts:
        opt.step()
    if trace:
        for e, samples in pending.items():
            print(e, *samples, file=trace, flush=True)
total = sum(p.double().sum().item() for p in model.parameters())
print(f"started as rank {started_as}: {step} steps, loss {loss.item():.6f}, parameters {total:.12f}", flush=True)
if save:
    saved = sum(t.double().sum().item() for t in torch.load(save).values())
    print(f"started as rank {started_as}: the checkpoint holds parameters {saved:.12f}", flush=True)
