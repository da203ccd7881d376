/* The backend plugins' ABI: the table a communication backend fills, and the entry point
 * libdpshim.so resolves in a backend plugin (libdpshim-mpi.so, shim/backends/mpi/) after opening
 * it with dlopen. The self backend fills the same table inside the library (backends/backend.c).
 * Plain C, nothing of the shim: a plugin builds from this file. */
#ifndef DPS_PLUGIN_ABI_BACKEND_H
#define DPS_PLUGIN_ABI_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef enum { DPS_RED_SUM, DPS_RED_MIN, DPS_RED_MAX } dps_redop_t;

/* A collective given up (elastic mode: a rank of the job was lost): buf is as it was. */
#define DPS_BACKEND_ABANDONED (-2)

/* The largest message on the guard's side channel, and on the file policy's. */
#define DPS_GUARD_MSG_MAX 1024
#define DPS_FILES_MSG_MAX 64

typedef struct dps_backend {
    const char *name;
    /* All in place on host memory; 0 on success, -1 with last_error() set. dtype: DP_* . With
     * DPS_RED_SUM, a weighted sum: each rank's elements multiplied by `pre` before the reduction,
     * the result by `post` after it (dps_scale_in_place; 1: as they are). Large buffers are
     * weighted piece by piece, each piece as it goes in or comes out, so that a weight costs no
     * pass over memory of its own. `one_tensor`: buf is one tensor, not a bucket of several, so
     * an algorithm whose summation order follows an element's offset in buf (a ring) gives the
     * same bits however the framework grouped its tensors. */
    int (*allreduce)(void *buf, size_t count, int dtype, dps_redop_t op, double pre, double post,
                     int one_tensor);
    int (*bcast)(void *buf, size_t bytes, int root);
    int (*barrier)(void);
    const char *(*last_error)(void);
    /* Before the program's own MPI_Finalize: release what the backend holds in MPI. */
    void (*release)(void);
    /* At exit: release, and finalize what the backend itself initialized. */
    void (*finalize)(void);
    /* 1 when the backend itself called MPI_Init, so the program's MPI_Init must not. */
    int (*owns_mpi_init)(void);
    /* The guard's side channel, apart from the data path, usable from the guard's thread while
     * the main thread is blocked in a collective; NULL when the backend has none (self, or an
     * MPI the program initialized without MPI_THREAD_MULTIPLE). Messages of DPS_GUARD_MSG_MAX
     * bytes at most. */
    int (*guard_send)(const void *msg, size_t len, int dest);
    /* 1 and the message when one has arrived, 0 when none, -1 on error. */
    int (*guard_poll)(void *msg, size_t len, int *src);
    /* Collectives of the main thread on the side channel (consistency checks): element-wise
     * minimum of n uint64 (n is the same on every rank; 1 or 2 may travel another way than
     * more), and every rank's `bytes` bytes gathered in rank order. */
    int (*guard_min_u64)(uint64_t *v, size_t n);
    int (*guard_allgather)(const void *mine, void *all, size_t bytes);
    /* The background channel: allreduce on a communicator of its own, called only from the
     * engine's progress thread while the main thread may run the other collectives; NULL when
     * the backend has none (then gradients are reduced synchronously). */
    int (*allreduce_bg)(void *buf, size_t count, int dtype, dps_redop_t op, double pre, double post,
                        int one_tensor);
    const char *(*last_error_bg)(void);
    /* The file policy's channel, from any thread: rank 0 posts a message to every other rank
     * (never blocking), the others wait for rank 0's next one, in the order posted. NULL when
     * the backend has none (self, or MPI below MPI_THREAD_MULTIPLE). 0, or -1 on error. */
    int (*files_post)(const void *msg, size_t len);
    int (*files_wait)(void *msg, size_t len);
    /* rank 0's next message where one has come: 1 (in msg), 0 where none has, -1 on error */
    int (*files_poll)(void *msg, size_t len);
    /* The other way: a rank tells rank 0 it has made a call (never blocking for long: a small
     * message), and rank 0 waits for the next such message from any rank; with set_abandon's
     * function set, it gives that wait up (DPS_BACKEND_ABANDONED) when the function says a rank
     * was lost. After a loss (set_survivors) the lowest survivor is rank 0 here. */
    int (*files_ack)(const void *msg, size_t len);
    int (*files_next_ack)(void *msg, size_t len, int *src);
    /* The job's sizes, once after the agreement, on every rank (a collective of the main thread):
     * large all-reductions go in pieces of piece_bytes; those of shm_bytes or less through
     * shared memory where every rank runs on one machine (0: never). */
    void (*set_sizes)(size_t piece_bytes, size_t shm_bytes);
    /* The wall clock (CLOCK_REALTIME) of this rank minus rank 0's, and half the best round trip
     * as its error bound, by ping-pong with rank 0; a collective of the main thread, where
     * measure[r] (the same table on every rank) says which ranks measure (0: offset 0). NULL
     * when the backend cannot. 0, or -1 with last_error() set. */
    int (*clock_offset)(const unsigned char *measure, int64_t *offset_ns, uint64_t *error_ns);
    /* Elastic mode, where a lost rank does not end the job; NULL where the backend cannot. From
     * set_abandon on, the main thread's collectives (allreduce, bcast, barrier) poll `abandon`
     * while they wait and give up when it returns non-zero (DPS_BACKEND_ABANDONED, buf as it was);
     * each completes only where every rank took part (a broadcast too), and the result of the last
     * one is kept until the next completes. A message that fails (a lost rank's link refused)
     * fails no collective: it waits for `abandon` too, so the caller bounds that wait (the
     * guard's timeout ends the job where no loss is found). */
    void (*set_abandon)(int (*abandon)(void));
    /* From now on the main thread's collectives run among ranks[0..n) of the job as it started
     * (this rank among them; the index in ranks is the rank they use, a broadcast's root too),
     * their messages tagged by `generation`. Local: no collective. 0, or -1 with last_error(). */
    int (*set_survivors)(const int *ranks, int n, uint32_t generation);
    /* Among the survivors: `root` sends the result of the last collective it completed (`bytes`
     * long) to each survivor i with need[i] set, into its buf. On the root, `result` (when not
     * NULL, result_bytes long) is that result: the last collective was not the backend's own (a
     * GPU one through NCCL). 0, DPS_BACKEND_ABANDONED or -1. */
    int (*replay)(void *buf, size_t bytes, int root, const unsigned char *need, const void *result,
                  size_t result_bytes);
    /* What the backend chose and measured, for logs and diagnostics ("" when nothing yet). */
    const char *(*tuning)(void);
} dps_backend_t;

/* Plugin entry point, resolved by name in libdpshim-<name>.so. */
typedef int (*dps_plugin_open_fn)(int expect_rank, int expect_size, dps_backend_t *out, char *err,
                                  size_t errlen);
#define DPS_PLUGIN_OPEN_SYMBOL "dps_plugin_open_v1"

#endif
