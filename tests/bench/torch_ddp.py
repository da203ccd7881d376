"""torch_plain.py converted to DistributedDataParallel by the PyTorch tutorial's recipe, to set
dpshim beside (dev.sh bench_ddp): gloo, rank and world size from Open MPI's environment,
MASTER_ADDR / MASTER_PORT from the caller, a DistributedSampler, the model wrapped in DDP.
--batch-size is per rank; rank 0 prints `steps_per_s X`."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_models


def main():
    p = argparse.ArgumentParser(description="train a benchmark model with DDP")
    torch_models.add_arguments(p)
    args = p.parse_args()

    rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    model, make_optimizer, loss_fn, dataset = torch_models.build(args.model, args.samples, args.seed)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world, rank=rank,
                                                              shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = DDP(model)
    optimizer = make_optimizer(model.parameters())
    model.train()

    phases = {} if args.phases else None
    loss, seconds = torch_models.timed_steps(model, optimizer, loss_fn, loader, args.warmup, args.steps,
                                             sampler.set_epoch, phases)
    if phases:
        torch_models.print_phases(phases, args.steps, "rank %d" % rank)
    if rank == 0:
        print("loss %.4f" % loss.item())
        print("steps_per_s %.3f" % (args.steps / seconds), flush=True)
        torch_models.print_memory(optimizer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
