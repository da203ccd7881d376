/* Elastic mode (elastic.c): the main thread's side of going on after a lost rank. */
#ifndef DPS_ENGINE_ELASTIC_H
#define DPS_ENGINE_ELASTIC_H

#include <stddef.h>

#include "backends/backend.h"
#include "engine.h"

/* Once the backend is open: on where [elastic] lost_rank = continue and the launcher keeps the
 * survivors (the backend's collectives can be given up from then on; [comm] overlap is off). */
/* At start-up, before an adapter reads the policy: where the job may go on after a loss,
 * [optim] shard = auto is off, as a sharded optimizer keeps each rank's share of its state on
 * that rank alone (on is kept, and then a loss ends the job: dps_elastic_setup says so). */
void dps_elastic_plan(dps_state_t *s);
void dps_elastic_setup(const dps_backend_t *be);
int dps_elastic_on(void);
/* The survivors are fewer than the job's ranks at its start (dp_rank and dp_world_size answer
 * them once the program is told). */
int dps_elastic_shrunk(void);
/* The program is told of the survivors now: where this rank's collective at the loss was
 * replayed, it is told otherwise at its next collective, where the other survivors find the loss;
 * for a call that ends at the loss on every survivor alike. */
void dps_elastic_tell(void);
/* A hook call begins (dps_comm): its gradients' weights need no correction yet. */
void dps_elastic_hook_begin(void);
/* The factor for the rest of the hook call's gradient sums after a loss met inside it (1: none). */
double dps_elastic_fix(void);
/* Split mode: a batch was split among the ranks of now (dp_batch). */
void dps_elastic_note_batch(void);
/* A rank was lost since: the gradients' weight for this rank's share of that batch (each survivor's
 * share of what the survivors hold), 1 with *w set; 0 where no rank was. */
int dps_elastic_batch_weight(uint64_t share, dps_weight_t *w);
/* Scale mode: the epoch's order drawn (dp_epoch, before it is cut); a training batch of n given
 * (dp_batch); a step ended (dp_step_end): the batches given since are trained. */
void dps_elastic_note_epoch(const uint64_t *order, uint64_t n);
void dps_elastic_epoch_batch(uint64_t n);
void dps_elastic_step_end(void);
/* Scale mode, at the end of this rank's shard and again after each share is trained: 1 where
 * this call shares out what is left (elastic mode, shards of one length), 0 where it returns the
 * share again (the call before could not hold it all); what ranks lost in the epoch had not
 * trained and was not shared out yet (this rank's view: the lowest survivor's is the job's); this
 * rank's share of the list shared out (given: cut as an epoch is, and kept; NULL: the share kept,
 * if any), for a call that holds cap of it. */
int dps_elastic_rest_due(void);
const uint64_t *dps_elastic_rest(uint64_t *n);
const uint64_t *dps_elastic_rest_share(const uint64_t *rest, uint64_t n, uint64_t cap, uint64_t *count);
/* A collective of the main thread completed. */
void dps_elastic_completed(void);
/* The same for a GPU collective through NCCL, whose result the GPU path keeps (a replay reads it
 * back with the reader the GPU path set: malloc'ed, *bytes long, NULL where it cannot); and a
 * replayed one the GPU path now keeps. */
void dps_elastic_completed_on_device(void);
void dps_elastic_set_result_reader(void *(*read)(size_t *bytes));
void dps_elastic_result_on_device(void);
/* Recoveries so far (a GPU communicator is made anew where it moved), and the survivors the
 * collectives run among: ranks of the job as it started, in order. */
unsigned dps_elastic_generation(void);
const int *dps_elastic_ranks(int *n);
/* At exit, on the lowest survivor: the job's losses said once more, and left for dpshim-run. */
void dps_elastic_at_exit(void);

/* After a loss: waits for the survivors' decision and goes on among them. `abandoned`: this rank
 * gave up the collective on buf (bytes long), which it then either holds completed
 * (DPS_ELASTIC_REPLAYED: another survivor had completed it) or must run again among the survivors
 * (DPS_ELASTIC_AGAIN; also where no collective was under way). The program is told of the
 * survivors at the collective run again, else at the next collective's start. Ends the job where
 * the survivors cannot go on. */
enum { DPS_ELASTIC_AGAIN = 0, DPS_ELASTIC_REPLAYED = 1 };
int dps_elastic_recover(const dps_backend_t *be, const char *hook, int abandoned, void *buf, size_t bytes);
/* Before a collective starts: a loss found and not yet gone through is, first (recover with no
 * collective under way), and the program is told of the survivors. Returns 1 where it went
 * through one, or was told of one only now. */
int dps_elastic_recover_pending(const dps_backend_t *be, const char *hook);

#endif
