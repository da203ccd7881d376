/* Start-up: the constructor that wires the parts together (init.c), at the top of the layers. */
#ifndef DPS_START_H
#define DPS_START_H

#include "core/dps.h"

/* [adapters] python: a Python rank process gets the PyTorch adapter (python.c). */
void dps_python_inject(const dps_state_t *s);
/* Rank 0 warns once where Open MPI's default binding leaves each rank fewer cores than the node
 * has per local rank (placement.c). */
void dps_placement_check(const dps_state_t *s);
/* [cpu] threads = share: OMP_NUM_THREADS set to the rank's share of the node's cores where the
 * environment sets no thread count (placement.c). */
void dps_threads_share(const dps_state_t *s);

/* At a rank's exit, in a job of two or more ranks where no hook shared out any work: rank 0 says
 * what was looked for and found; 1 where [guard] nothing_shared = error ends it (every rank
 * says so then), else 0 (nothing_shared.c). */
int dps_check_something_shared(void);

/* At a rank's exit, after the exit barrier: rank 0 of a job of two or more ranks prints one line
 * on what the job did ([diag] summary; summary.c). */
void dps_summary_at_exit(void);

#endif
