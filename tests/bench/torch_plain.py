"""The unmodified single-process trainer of the DDP comparison (dev.sh bench_ddp): it knows
nothing of dpshim; `mpirun -np N env LD_PRELOAD=libdpshim.so` makes it data-parallel.
Prints `steps_per_s X` and its memory (peak_rss_mb, optim_state_mb); what a step holds (the global batch) is for the caller to know."""

import argparse

import torch

import torch_models


def main():
    p = argparse.ArgumentParser(description="train a benchmark model alone")
    torch_models.add_arguments(p)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    model, make_optimizer, loss_fn, dataset = torch_models.build(args.model, args.samples, args.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    optimizer = make_optimizer(model.parameters())
    model.train()

    phases = {} if args.phases else None
    loss, seconds = torch_models.timed_steps(model, optimizer, loss_fn, loader, args.warmup, args.steps,
                                             phases=phases)
    if phases:
        torch_models.print_phases(phases, args.steps, "this process")
    print("loss %.4f" % loss.item())
    print("steps_per_s %.3f" % (args.steps / seconds), flush=True)
    torch_models.print_memory(optimizer)


if __name__ == "__main__":
    main()
