"""torch_resnet.py converted to DistributedDataParallel by the PyTorch tutorial's recipe, to set
the unmodified script under dpshim beside it (`./dev.sh gpu-check bench`): rank and world size
from Open MPI's environment (RANK, WORLD_SIZE and LOCAL_RANK set from them), MASTER_ADDR and
MASTER_PORT from the caller (127.0.0.1:29500 unless set), NCCL on CUDA and gloo on the CPU, the
rank's GPU by its local rank (modulo the GPUs it sees: two ranks may share one), a
DistributedSampler, the model wrapped in DDP with bucket_cap_mb = --bucket-mb (25, DDP's default
and dpshim's [comm] bucket_mb); DDP overlaps the reduction with backward. --batch-size is per
rank. --sync-bn converts the BatchNorm layers to nn.SyncBatchNorm (GPU only in PyTorch), DDP's
way to the statistics dpshim synchronizes by default. Rank 0 prints what torch_resnet.py prints."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_resnet


def main():
    p = argparse.ArgumentParser(description="train the ResNet-18-like network with DDP")
    torch_resnet.add_arguments(p)
    p.add_argument("--bucket-mb", type=int, default=25, help="DDP's bucket_cap_mb")
    p.add_argument("--sync-bn", action="store_true", help="nn.SyncBatchNorm in place of BatchNorm")
    args = p.parse_args()

    rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", rank))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    cuda = args.device.startswith("cuda")
    if cuda:
        dev = local % torch.cuda.device_count()
        torch.cuda.set_device(dev)
        args.device = "cuda:%d" % dev
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)

    torch.manual_seed(args.seed)
    model, optimizer, dataset = torch_resnet.build(args)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world, rank=rank,
                                                              shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    if args.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model, device_ids=[dev] if cuda else None, bucket_cap_mb=args.bucket_mb)
    loss, seconds = torch_resnet.train(model, optimizer, loader, args, sampler.set_epoch)
    if rank == 0:
        torch_resnet.report(model, loss, seconds, args)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
