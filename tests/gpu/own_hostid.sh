#!/bin/sh
# own_hostid.sh CMD...: CMD with an NCCL_HOSTID of this rank's own, so that NCCL's duplicate-GPU
# check (host hash and bus id) lets two ranks share the one GPU of a test machine.
NCCL_HOSTID=dpshim-rank-${OMPI_COMM_WORLD_RANK:-0}
export NCCL_HOSTID
exec "$@"
