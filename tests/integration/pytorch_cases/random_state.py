# seeds from the pid (also before torch's import), None, torch.seed(), constants; prints what
# each generator draws after each
import os, random, sys
import numpy as np  # before torch, as a data module may do
print("before torch: random %.17g numpy %.17g" % (random.random(), np.random.rand()))
random.seed(os.getpid())  # before torch's import, rank-dependent
import torch
print("at import: torch %.17g random %.17g numpy %.17g" % (torch.rand(1).item(), random.random(), np.random.rand()))
torch.manual_seed(os.getpid() + 7)
random.seed(); np.random.seed(None)
print("pid and None seeds: torch %.17g random %.17g numpy %.17g" % (torch.rand(1).item(), random.random(), np.random.rand()))
s = torch.seed()
print("torch.seed: %d %s" % (s, s == torch.initial_seed()))
torch.manual_seed(5); random.seed("five"); np.random.seed(5)
print("constant seeds: torch %.17g random %.17g numpy %.17g" % (torch.rand(1).item(), random.random(), np.random.rand()))
w = torch.nn.Linear(3, 1).weight  # a new module's initial weights, drawn from the agreed stream
print("weights", w.detach().view(-1).tolist())
