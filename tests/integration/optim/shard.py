"""A small trainer for [optim] shard: the same steps with sharding off and on must leave every
rank with bitwise the same parameters and optimizer state_dict. Prints, on every rank:
  params <sha256 of every parameter's bytes>
  state <sha256 of torch.save(optimizer.state_dict())>
  state_elements <elements of the optimizer's own state on this rank>

  shard.py --opt OPT[,OPT...] [--steps N] [--save F] [--load F] [--tensors small|few]
  OPT: sgd|sgd0|adam|adamw|rmsprop|adagrad|custom|groups|lbfgs|sgd_closure
Several OPTs train one after the other in the one process, each a fresh model and optimizer, and
their lines start with the OPT ("adam params ..."). --save F: torch.save(optimizer.state_dict(), F)
at the end (a checkpoint); --load F: the optimizer loads F before training (a resumed run);
--tensors few: 3 parameter tensors, so that at np=4 some rank owns none of them whole;
sgd_closure: SGD with momentum stepped as step(closure), as LBFGS is."""
import argparse
import hashlib
import io

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--opt", default="adam")
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--save")
ap.add_argument("--load")
ap.add_argument("--tensors", default="small")
args = ap.parse_args()

class Lion(torch.optim.Optimizer):
    """A custom optimizer of the script's own (sign of an interpolated momentum)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.99)):
        super().__init__(params, dict(lr=lr, betas=betas))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["exp_avg"] = torch.zeros_like(p)
                m = st["exp_avg"]
                p.add_(torch.sign(m * b1 + p.grad * (1 - b1)), alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


def sha(b):
    return hashlib.sha256(b).hexdigest()[:16]


def optimizer(name, params):
    """The optimizer called name over params, and its scheduler (or None)."""
    if name in ("sgd", "sgd_closure"):
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4), None
    if name == "sgd0":  # no momentum: its state holds None for every parameter
        return torch.optim.SGD(params, lr=0.05), None
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-2), None
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, amsgrad=True), None
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-3, momentum=0.5, centered=True), None
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=0.05), None
    if name == "custom":
        return Lion(params, lr=1e-3), None
    if name == "groups":  # two groups with their own lr, a scheduler changing both
        opt = torch.optim.Adam([{"params": params[:2], "lr": 1e-2}, {"params": params[2:]}], lr=3e-3)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    if name == "lbfgs":
        return torch.optim.LBFGS(params, lr=0.5, max_iter=4), None
    raise SystemExit("shard.py: no optimizer " + name)


def train(name, tag):
    torch.manual_seed(0)
    if args.tensors == "few":
        model = nn.Sequential(nn.Linear(16, 40, bias=False), nn.Tanh(), nn.Linear(40, 5))
    else:
        model = nn.Sequential(nn.Linear(16, 300), nn.ReLU(), nn.Linear(300, 64), nn.ReLU(),
                              nn.Linear(64, 5), nn.LayerNorm(5))
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(240, 16, generator=g),
                                          torch.randint(0, 5, (240,), generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=24, shuffle=True)
    opt, scheduler = optimizer(name, list(model.parameters()))
    if args.load:
        opt.load_state_dict(torch.load(args.load))

    steps = 0
    while steps < args.steps:
        for x, y in loader:
            def closure():
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss
            if name in ("lbfgs", "sgd_closure"):
                opt.step(closure)
            else:
                closure()
                opt.step()
            if scheduler:
                scheduler.step()
            steps += 1
            if steps == args.steps:
                break

    print(tag + "params", sha(b"".join(p.detach().numpy().tobytes() for p in model.parameters())))
    buf = io.BytesIO()
    sd = opt.state_dict()
    torch.save(sd, buf)
    print(tag + "state", sha(buf.getvalue()))
    print(tag + "state_elements",
          sum(v.numel() for st in opt.state.values() for v in st.values() if torch.is_tensor(v)))
    if args.save:
        torch.save(sd, args.save)


names = args.opt.split(",")
for name in names:
    train(name, name + " " if len(names) > 1 else "")
