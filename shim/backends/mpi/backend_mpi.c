/* The mpi backend plugin (libdpshim-mpi.so): host-buffer collectives on a private duplicate of
 * MPI_COMM_WORLD. It calls the PMPI_ entry points so that the shim's own MPI_Init/Finalize
 * interposers (for the program's calls) never see the shim's calls. Errors are returned, not
 * fatal, so the engine can report them with context. */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "plugin_abi/backend.h"
#include "dpshim/hooks.h"
#include "core/dtype.h"
#include "shm_sum.h"

/* A data channel: a communicator with its own piece size and error text. The main thread uses
 * `main_ch`; the engine's progress thread uses `bg_ch`, so background gradient reductions never
 * interleave with the main thread's collectives on one communicator. */
typedef struct channel {
    MPI_Comm comm;
    int rank, size;
    size_t piece_bytes; /* large reductions go in pieces of this size ([comm] piece_kb) */
    void *block;        /* the ring's receive buffer, block_bytes long */
    size_t block_bytes;
    dps_shm_sum_t *shm; /* small sums, where every rank runs on this machine ([comm] shm_kb) */
    /* after a lost rank (elastic mode): the survivors' ranks on comm, rank and size among them,
     * every sum as a ring, and tags of the survivors' generation */
    int *map;
    int ring_always, tag_base;
    char err[512];
} channel_t;

static channel_t main_ch = {.comm = MPI_COMM_NULL}, bg_ch = {.comm = MPI_COMM_NULL};
static MPI_Comm guard_comm = MPI_COMM_NULL, files_comm = MPI_COMM_NULL;
/* The file channel's leader (a world rank) and the ranks it tells (NULL: every other rank):
 * rank 0's, until the survivors of its loss go on (mpi_set_survivors) */
static pthread_mutex_t files_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int files_leader;
static int *files_targets, nfiles_targets;
static int initialized_by_us;

/* Elastic mode (set_abandon): the main channel's waits give up when this says so. */
static int (*abandon_fn)(void);

static int check(channel_t *ch, int rc, const char *what)
{
    if (rc == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (PMPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    snprintf(ch->err, sizeof ch->err, "%s failed: %s", what, msg);
    return -1;
}

/* Half-precision sums for [comm] compress: MPI has no 16-bit float, so two bytes with a
 * reduction of our own that adds in f32 and rounds back. */
static MPI_Datatype half_type = MPI_DATATYPE_NULL;
static MPI_Op f16_sum = MPI_OP_NULL, bf16_sum = MPI_OP_NULL;
/* Bytes are summed modulo 256 as C, NCCL and the frameworks do: Open MPI 4.1's AVX reduction
 * saturates 8-bit sums (3 + 255 gives 255 from 16 elements on; open-mpi/ompi#8045, closed
 * "wontfix"), so the GPU and host paths would disagree. */
static MPI_Op u8_sum = MPI_OP_NULL;

/* a += b over n halves of the given type, in f32 */
static void half_sum(const void *in, void *inout, int n, int dtype)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < n; i++)
        b[i] = dtype == DP_F16 ? dps_f32_to_f16(dps_f16_to_f32(a[i]) + dps_f16_to_f32(b[i]))
                               : dps_f32_to_bf16(dps_bf16_to_f32(a[i]) + dps_bf16_to_f32(b[i]));
}

static void f16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *t)
{
    (void)t;
    half_sum(in, inout, *len, DP_F16);
}

static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *t)
{
    (void)t;
    half_sum(in, inout, *len, DP_BF16);
}

static void u8_sum_fn(void *in, void *inout, int *len, MPI_Datatype *t)
{
    (void)t;
    const uint8_t *a = in;
    uint8_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = (uint8_t)(a[i] + b[i]);
}

static MPI_Datatype mpi_dtype(int dtype)
{
    switch (dtype) {
    case DP_F16:
    case DP_BF16:
        return half_type;
    case DP_F32:
        return MPI_FLOAT;
    case DP_F64:
        return MPI_DOUBLE;
    case DP_I32:
        return MPI_INT32_T;
    case DP_I64:
        return MPI_INT64_T;
    case DP_U8:
        return MPI_UINT8_T;
    default:
        return MPI_DATATYPE_NULL;
    }
}

/* Large sums go as a ring, in pieces. The ring (a reduce-scatter, then an all-gather, by
 * point-to-point messages on the channel's communicator) reduces each block on one rank with Open
 * MPI's own reduction (MPI_Reduce_local, vectorized), and that rank weights the block (`post`)
 * right there, while it is in cache: Open MPI's MPI_Allreduce would need a pass over memory of its
 * own for the weight, which cost more than the reduction here. Each element is reduced on one rank
 * only, so every rank ends with the same bits. The pieces ([comm] piece_kb, the job's) keep each
 * ring's working set in cache. Their size is fixed, not measured at run time: a ring's blocks
 * follow the pieces, and with them the order of additions at 3 ranks or more, so a measured size
 * would make results depend on timing (and differ between the two channels). Smaller buffers, and
 * minima and maxima, go to MPI_Allreduce. */
#define RING_MIN_BUFFER (256u << 10)
#define PIECE_MIN_BUFFER (8u << 20) /* for MPI_Allreduce, which gains from pieces from about 16 MiB on */
#define DEFAULT_PIECE (1u << 20)    /* [comm] piece_kb's default, until the engine sets it */
enum { TAG_SCATTER = 11, TAG_GATHER = 12 };

/* Waits for n requests: blocking, or in elastic mode polling, and giving up (-2) when the guard
 * says a rank is lost; the requests are left to MPI then (never freed: their buffers are the
 * caller's to leave alone). In elastic mode a failed message waits for the guard too (see
 * set_abandon). */
/* MPI_ERR_IN_STATUS names no error: the first request's own does (a truncation: a desync). */
static int status_error(int rc, const MPI_Status *st, int n)
{
    for (int i = 0; rc == MPI_ERR_IN_STATUS && st != MPI_STATUSES_IGNORE && i < n; i++)
        if (st[i].MPI_ERROR != MPI_SUCCESS) return st[i].MPI_ERROR;
    return rc;
}

static int wait_all(channel_t *ch, MPI_Request *reqs, int n, MPI_Status *st, const char *what)
{
    if (!abandon_fn || ch != &main_ch) return check(ch, status_error(PMPI_Waitall(n, reqs, st), st, n), what);
    int failed = 0;
    for (;;) {
        int done = 0, cls = 0;
        if (!failed) {
            int rc = status_error(PMPI_Testall(n, reqs, &done, st), st, n);
            /* a message to or from a lost rank of another host (its link refused) fails: the guard
             * finds the loss, or ends the job at its timeout; a truncated one is a desync, said now.
             * A failed message completes nothing. */
            if (rc != MPI_SUCCESS && (PMPI_Error_class(rc, &cls) != MPI_SUCCESS || cls == MPI_ERR_TRUNCATE))
                return check(ch, rc, what);
            failed = check(ch, rc, what) != 0;
            if (done && !failed) return 0;
        }
        if (abandon_fn()) {
            snprintf(ch->err, sizeof ch->err, "%s given up: a rank of the job was lost", what);
            return -2;
        }
        if (failed) {
            struct timespec nap = {0, 1000000};
            nanosleep(&nap, NULL);
        }
    }
}

/* One piece (a count MPI can take), weighted on the way in and out; minima and maxima have pre =
 * post = 1. */
typedef int (*piece_fn)(channel_t *ch, char *p, int n, int dtype, MPI_Datatype t, MPI_Op o, size_t es,
                        double pre, double post);

static int allreduce_piece(channel_t *ch, char *p, int n, int dtype, MPI_Datatype t, MPI_Op o, size_t es,
                           double pre, double post)
{
    (void)es;
    dps_scale_in_place(p, (size_t)n, dtype, pre);
    if (abandon_fn && ch == &main_ch) {
        MPI_Request req;
        if (check(ch, PMPI_Iallreduce(MPI_IN_PLACE, p, n, t, o, ch->comm, &req), "MPI_Iallreduce")) return -1;
        int rc = wait_all(ch, &req, 1, MPI_STATUSES_IGNORE, "MPI_Iallreduce");
        if (rc) return rc;
    } else if (check(ch, PMPI_Allreduce(MPI_IN_PLACE, p, n, t, o, ch->comm), "MPI_Allreduce")) {
        return -1;
    }
    dps_scale_in_place(p, (size_t)n, dtype, post);
    return 0;
}

/* buf in pieces of `piece` bytes at most (and of INT_MAX elements at most: MPI counts are int). */
static int in_pieces(channel_t *ch, piece_fn one, void *buf, size_t count, int dtype, MPI_Datatype t,
                     MPI_Op o, size_t es, double pre, double post, size_t piece)
{
    size_t per = piece / es ? piece / es : 1;
    if (per > (size_t)INT_MAX) per = (size_t)INT_MAX;
    for (size_t off = 0; off < count; off += per) {
        int rc = one(ch, (char *)buf + off * es, (int)(count - off < per ? count - off : per), dtype, t, o,
                     es, pre, post);
        if (rc) return rc;
    }
    return 0;
}

/* One message of the ring: n elements to the right neighbour, as many from the left one. */
static int ring_step(channel_t *ch, const char *send, int ns, char *recv, int nr, MPI_Datatype t, int tag)
{
    int right = (ch->rank + 1) % ch->size, left = (ch->rank + ch->size - 1) % ch->size, got = -1;
    if (ch->map) right = ch->map[right], left = ch->map[left];
    tag += ch->tag_base;
    MPI_Request reqs[2];
    MPI_Status st[2];
    if (check(ch, PMPI_Irecv(recv, nr, t, left, tag, ch->comm, &reqs[0]), "MPI_Irecv") ||
        check(ch, PMPI_Isend(send, ns, t, right, tag, ch->comm, &reqs[1]), "MPI_Isend"))
        return -1;
    int rc = wait_all(ch, reqs, 2, st, "a ring step");
    if (rc) return rc;
    PMPI_Get_count(&st[0], t, &got);
    if (got != nr) { /* a larger message fails in MPI_Sendrecv itself */
        snprintf(
            ch->err, sizeof ch->err,
            "rank %d sent %d elements of a ring all-reduce where %d were due (ranks are reducing buffers of "
            "different sizes: a desync)",
            left, got, nr);
        return -1;
    }
    return 0;
}

/* The ring's last step for an f32 sum: own = (own + in) * w in one pass, as fast as Open MPI's own
 * vectorized sum (a weighting pass after that sum cost as much again). The same bits as the sum,
 * then dps_scale_in_place. Built for the widest vectors the CPU has (the generic x86-64 build ran
 * at half the speed of Open MPI's AVX sum here), and `restrict`, without which -O2 leaves the loop
 * scalar. */
DPS_WIDEST_VECTORS static void add_weighted_f32(float *restrict own, const float *restrict in, size_t n,
                                                double w)
{
    float wf = (float)w;
    if ((double)wf == w)
        DPS_SCALE_LOOP(n, j, own[j] = (own[j] + in[j]) * wf);
    else
        DPS_SCALE_LOOP(n, j, own[j] = (float)((double)(own[j] + in[j]) * w));
}

static int ring_steps(channel_t *ch, char *buf, int count, int dtype, MPI_Datatype t, MPI_Op o, size_t es,
                      double post);

/* A ring given up leaves its receive block to MPI: a fresh one is taken next time. */
static int ring(channel_t *ch, char *buf, int count, int dtype, MPI_Datatype t, MPI_Op o, size_t es,
                double post)
{
    int rc = ring_steps(ch, buf, count, dtype, t, o, es, post);
    if (rc == -2) ch->block = NULL, ch->block_bytes = 0;
    return rc;
}

static int ring_steps(channel_t *ch, char *buf, int count, int dtype, MPI_Datatype t, MPI_Op o, size_t es,
                      double post)
{
    int p = ch->size, r = ch->rank, block = (count + p - 1) / p;
    if ((size_t)block * es > ch->block_bytes) {
        void *b = realloc(ch->block, (size_t)block * es);
        if (!b) {
            snprintf(ch->err, sizeof ch->err, "out of memory for a %zu-byte ring block", (size_t)block * es);
            return -1;
        }
        ch->block = b, ch->block_bytes = (size_t)block * es;
    }
#define RING_AT(b) ((b)*block < count ? (b)*block : count)
#define RING_LEN(b) (RING_AT((b) + 1) - RING_AT(b))
    int fused = dtype == DP_F32 && o == MPI_SUM && post != 1.0 && post != 0.0;
    for (int s = 0; s < p - 1; s++) { /* after step s, block r-s-1 holds s+2 ranks' sum */
        int out = (r - s + p) % p, in = (r - s - 1 + 2 * p) % p;
        char *dst = buf + (size_t)RING_AT(in) * es;
        int rc = ring_step(ch, buf + (size_t)RING_AT(out) * es, RING_LEN(out), ch->block, RING_LEN(in), t,
                           TAG_SCATTER);
        if (rc) return rc;
        if (s == p - 2 && fused) /* block r+1: complete here, and weighted on the way */
            add_weighted_f32((float *)dst, ch->block, (size_t)RING_LEN(in), post);
        else if (check(ch, PMPI_Reduce_local(ch->block, dst, RING_LEN(in), t, o), "MPI_Reduce_local"))
            return -1;
    }
    int own = (r + 1) % p; /* complete here, and in cache */
    if (!fused) dps_scale_in_place(buf + (size_t)RING_AT(own) * es, (size_t)RING_LEN(own), dtype, post);
    for (int s = 0; s < p - 1; s++) {
        int out = (r + 1 - s + p) % p, in = (r - s + p) % p;
        int rc = ring_step(ch, buf + (size_t)RING_AT(out) * es, RING_LEN(out), buf + (size_t)RING_AT(in) * es,
                           RING_LEN(in), t, TAG_GATHER);
        if (rc) return rc;
    }
#undef RING_AT
#undef RING_LEN
    return 0;
}

static int ring_piece(channel_t *ch, char *p, int n, int dtype, MPI_Datatype t, MPI_Op o, size_t es,
                      double pre, double post)
{
    dps_scale_in_place(p, (size_t)n, dtype, pre); /* a rank's own weight: before anything is sent */
    return ring(ch, p, n, dtype, t, o, es, post);
}

static char tuning[384];
static dps_shm_sum_t *guard_shm;

static void mpi_set_sizes(size_t piece_bytes, size_t shm_bytes)
{
    main_ch.piece_bytes = bg_ch.piece_bytes = piece_bytes;
    const char *why = NULL;
    main_ch.shm = dps_shm_sum_open(main_ch.comm, shm_bytes, &why);
    if (main_ch.shm && bg_ch.comm != MPI_COMM_NULL &&
        !(bg_ch.shm = dps_shm_sum_open(bg_ch.comm, shm_bytes, &why))) {
        /* both channels add alike, or [comm] overlap would change results */
        dps_shm_sum_close(main_ch.shm), main_ch.shm = NULL;
    }
    if (main_ch.shm && guard_comm != MPI_COMM_NULL) guard_shm = dps_shm_sum_open(guard_comm, 64, &why);
    int o = snprintf(tuning, sizeof tuning,
                     "sums of 256 KiB or more as a ring, in pieces of %zu KiB ([comm] piece_kb)",
                     piece_bytes >> 10);
    if (main_ch.shm)
        snprintf(tuning + o, sizeof tuning - (size_t)o,
                 "; sums of %zu KiB or less through shared memory ([comm] shm_kb)", shm_bytes >> 10);
    else
        snprintf(tuning + o, sizeof tuning - (size_t)o, "; small sums through MPI: %s", why);
}

/* What the backend chose, for logs and diagnostics. */
static const char *mpi_tuning(void)
{
    return tuning;
}

static int channel_allreduce(channel_t *ch, void *buf, size_t count, int dtype, dps_redop_t op, double pre,
                             double post, int one_tensor)
{
    MPI_Datatype t = mpi_dtype(dtype);
    int half = dtype == DP_F16 || dtype == DP_BF16;
    MPI_Op o = half                ? (dtype == DP_F16 ? f16_sum : bf16_sum)
               : op == DPS_RED_MIN ? MPI_MIN
               : op == DPS_RED_MAX ? MPI_MAX
               : dtype == DP_U8    ? u8_sum
                                   : MPI_SUM;
    size_t es = (size_t)(dtype == DP_F64 || dtype == DP_I64 ? 8 : dtype == DP_U8 ? 1 : half ? 2 : 4);
    if (half && op != DPS_RED_SUM) {
        snprintf(ch->err, sizeof ch->err, "mpi backend: half precision is only summed");
        return -1;
    }
    if (t == MPI_DATATYPE_NULL) {
        snprintf(ch->err, sizeof ch->err, "mpi backend: dtype %d cannot be reduced", dtype);
        return -1;
    }
    if (op != DPS_RED_SUM) pre = post = 1.0;
    if (ch->shm && count * es <= dps_shm_sum_max(ch->shm))
        return dps_shm_sum(ch->shm, buf, (int)count, dtype, t, o, (int)op, es, pre, post, ch->err,
                           sizeof ch->err);
    /* the ring's summation order follows an element's offset in buf: only where that offset is
     * the same however tensors were grouped (one tensor) do results stay independent of grouping */
    int by_ring = ch->ring_always || (op == DPS_RED_SUM && one_tensor && count * es >= RING_MIN_BUFFER);
    size_t piece = ch->piece_bytes ? ch->piece_bytes : DEFAULT_PIECE;
    if (!by_ring && count * es < PIECE_MIN_BUFFER) piece = SIZE_MAX;
    return in_pieces(ch, by_ring ? ring_piece : allreduce_piece, buf, count, dtype, t, o, es, pre, post,
                     piece);
}

/* --- elastic mode: the main channel's collectives can be given up, and replayed ---------------
 * Each runs on a scratch copy: a collective given up may still be written into by MPI later, so
 * its scratch is left to MPI and the caller's buffer stays as it was. The result of the last one
 * that completed is kept (two scratch buffers in turn) until the next completes: a survivor that
 * gave up the collective another completed gets that result from it (replay). After a loss the
 * survivors' collectives are rings of point-to-point messages among them on the same
 * communicator (no collective over a communicator that holds a lost rank can ever complete), with
 * tags of the survivors' generation, so that messages of a collective given up never match. */
static struct {
    void *scratch[2];
    size_t bytes[2];
    int next; /* the scratch the next collective uses */
    int last; /* the one holding the last result, -1: none */
    size_t last_bytes;
} el = {.last = -1};

static void *scratch(size_t bytes)
{
    int k = el.next;
    if (el.bytes[k] < bytes || !el.scratch[k]) {
        void *p = realloc(el.scratch[k], bytes ? bytes : 1);
        if (!p) {
            snprintf(main_ch.err, sizeof main_ch.err, "out of memory for a %zu-byte collective", bytes);
            return NULL;
        }
        el.scratch[k] = p, el.bytes[k] = bytes;
    }
    return el.scratch[k];
}

/* The collective on el.scratch[el.next] ended with rc: keep its result, or leave it to MPI. */
static int settle(int rc, void *buf, size_t bytes)
{
    int k = el.next;
    if (rc == 0) {
        if (buf && bytes) memcpy(buf, el.scratch[k], bytes);
        el.last = k, el.last_bytes = bytes, el.next = k ^ 1;
    } else if (rc == -2) {
        el.scratch[k] = NULL, el.bytes[k] = 0; /* MPI may still write there */
    }
    return rc;
}

/* buf = every rank's buf combined by o (a bitwise OR gives the root's bytes: the others give
 * zeros), as one collective that completes only where every rank took part. */
static int elastic_combine(void *buf, size_t count, MPI_Datatype t, MPI_Op o, size_t es, int give_zeros)
{
    void *sc = scratch(count * es);
    if (!sc) return -1;
    if (give_zeros)
        memset(sc, 0, count * es);
    else
        memcpy(sc, buf, count * es);
    size_t piece = main_ch.piece_bytes ? main_ch.piece_bytes : DEFAULT_PIECE;
    int rc = in_pieces(&main_ch, main_ch.ring_always ? ring_piece : allreduce_piece, sc, count, DP_U8, t, o,
                       es, 1.0, 1.0, main_ch.ring_always ? piece : SIZE_MAX);
    return settle(rc, buf, count * es);
}

static int mpi_allreduce(void *buf, size_t count, int dtype, dps_redop_t op, double pre, double post,
                         int one_tensor)
{
    if (!abandon_fn) return channel_allreduce(&main_ch, buf, count, dtype, op, pre, post, one_tensor);
    size_t bytes = count * dps_dtype_size(dtype);
    void *sc = scratch(bytes);
    if (!sc) return -1;
    memcpy(sc, buf, bytes);
    return settle(channel_allreduce(&main_ch, sc, count, dtype, op, pre, post, one_tensor), buf, bytes);
}

static void mpi_set_abandon(int (*abandon)(void))
{
    abandon_fn = abandon;
    dps_shm_abandon = abandon;
}

/* The survivors: ranks[0..n) of MPI_COMM_WORLD, in order. No collective (none over a
 * communicator holding a lost rank completes): the main channel's messages go to them by their
 * world ranks on the same communicator from now on. */
static int mpi_set_survivors(const int *ranks, int n, uint32_t generation)
{
    int world = -1, me = -1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &world);
    for (int i = 0; i < n; i++)
        if (ranks[i] == world) me = i;
    int *map = malloc((size_t)(n > 0 ? n : 1) * sizeof *map);
    if (me < 0 || !map) {
        free(map);
        snprintf(main_ch.err, sizeof main_ch.err, "rank %d is not among the survivors", world);
        return -1;
    }
    memcpy(map, ranks, (size_t)n * sizeof *map);
    int *targets = malloc((size_t)(n > 1 ? n - 1 : 1) * sizeof *targets);
    if (!targets) {
        free(map);
        snprintf(main_ch.err, sizeof main_ch.err, "no memory for the survivors' table");
        return -1;
    }
    memcpy(targets, ranks + 1, (size_t)(n - 1) * sizeof *targets);
    pthread_mutex_lock(&files_lock);
    free(files_targets);
    files_targets = targets, nfiles_targets = n - 1;
    atomic_store(&files_leader, ranks[0]);
    pthread_mutex_unlock(&files_lock);
    free(main_ch.map);
    main_ch.map = map, main_ch.rank = me, main_ch.size = n, main_ch.ring_always = 1;
    main_ch.tag_base = 1000 + (int)(generation % 100000) * 16; /* 3, 11, 12 within each 16 */
    dps_shm_sum_close(main_ch.shm), main_ch.shm = NULL;        /* its segment counts the lost rank */
    return 0;
}

/* The last completed collective's result, from the survivor root (an index among them) to those
 * whose need[] is set, into buf (bytes long on every one of them). It goes in pieces of [comm]
 * piece_kb: one MPI message holds at most INT_MAX bytes, and a GPU result is a whole hook call's. */
static int mpi_replay(void *buf, size_t bytes, int root, const unsigned char *need, const void *result,
                      size_t result_bytes)
{
    channel_t *ch = &main_ch;
    int tag = ch->tag_base + 3, n = ch->size;
    size_t piece = ch->piece_bytes ? ch->piece_bytes : DEFAULT_PIECE;
    if (root == ch->rank) {
        const char *from = result ? result : el.last >= 0 ? el.scratch[el.last] : NULL;
        size_t from_bytes = result ? result_bytes : el.last_bytes;
        if (!from) {
            snprintf(ch->err, sizeof ch->err, "replay: this rank has no result to send");
            return -1;
        }
        MPI_Request *reqs = malloc((size_t)n * sizeof *reqs);
        if (!reqs) return -1;
        int rc = 0;
        /* its last result, whatever collective it gave up since */
        for (size_t off = 0; rc == 0 && (off < from_bytes || off == 0); off += piece) {
            int len = (int)(from_bytes - off < piece ? from_bytes - off : piece), nreq = 0;
            for (int i = 0; i < n && rc == 0; i++)
                if (need[i] && i != root)
                    rc = check(
                        ch, PMPI_Isend(from + off, len, MPI_BYTE, ch->map[i], tag, ch->comm, &reqs[nreq++]),
                        "MPI_Isend");
            if (rc == 0) rc = wait_all(ch, reqs, nreq, MPI_STATUSES_IGNORE, "the replay");
        }
        free(reqs);
        return rc;
    }
    if (!need[ch->rank]) return 0;
    char *sc = scratch(bytes);
    if (!sc) return -1;
    int rc = 0;
    for (size_t off = 0; rc == 0 && (off < bytes || off == 0); off += piece) {
        int len = (int)(bytes - off < piece ? bytes - off : piece), got = -1;
        MPI_Request req;
        MPI_Status st;
        rc = check(ch, PMPI_Irecv(sc + off, len, MPI_BYTE, ch->map[root], tag, ch->comm, &req), "MPI_Irecv");
        if (rc == 0) rc = wait_all(ch, &req, 1, &st, "the replay");
        if (rc == 0 && (PMPI_Get_count(&st, MPI_BYTE, &got), got != len)) {
            snprintf(ch->err, sizeof ch->err,
                     "replay: %d bytes came where %d were due at byte %zu of %zu (a desync)", got, len, off,
                     bytes);
            rc = -1;
        }
    }
    return settle(rc, buf, bytes);
}

static int mpi_allreduce_bg(void *buf, size_t count, int dtype, dps_redop_t op, double pre, double post,
                            int one_tensor)
{
    return channel_allreduce(&bg_ch, buf, count, dtype, op, pre, post, one_tensor);
}

static int mpi_bcast(void *buf, size_t bytes, int root)
{
    /* elastic mode: a combination that completes only where every rank took part, so that no
     * survivor is more than one collective ahead of another */
    if (abandon_fn) return elastic_combine(buf, bytes, MPI_UINT8_T, MPI_BOR, 1, main_ch.rank != root);
    for (size_t off = 0; off < bytes;) {
        int n = bytes - off > (size_t)INT_MAX ? INT_MAX : (int)(bytes - off);
        if (check(&main_ch, PMPI_Bcast((char *)buf + off, n, MPI_BYTE, root, main_ch.comm), "MPI_Bcast"))
            return -1;
        off += (size_t)n;
    }
    return 0;
}

static int mpi_barrier(void)
{
    unsigned char one = 1;
    if (abandon_fn) return elastic_combine(&one, 1, MPI_UINT8_T, MPI_BOR, 1, 0);
    return check(&main_ch, PMPI_Barrier(main_ch.comm), "MPI_Barrier");
}

static const char *mpi_last_error(void)
{
    return main_ch.err;
}
static const char *mpi_last_error_bg(void)
{
    return bg_ch.err;
}

/* The guard channel: point-to-point messages on a communicator of its own. A send never blocks:
 * a peer out of reach (a cut link, a node down) must not stop the watchdog. Each message is
 * copied into a slot of its peer's and sent with MPI_Isend; a slot is reused once its send
 * completed. Each peer has slots of its own, made as they are needed: a send to a lost peer never
 * completes, and a peer that holds them all (it takes no messages) gets no more, while the others
 * still get theirs (the survivors' agreement among them). Both the watchdog and the main thread
 * (the exit barrier's notice) send. */
#define GUARD_SLOTS_PER_PEER 8
typedef struct guard_slot {
    MPI_Request req;
    char buf[DPS_GUARD_MSG_MAX];
} guard_slot_t;
static guard_slot_t **guard_slots; /* GUARD_SLOTS_PER_PEER per peer, each NULL until needed */
static int npeers;
static pthread_mutex_t guard_slots_lock = PTHREAD_MUTEX_INITIALIZER;

static int slot_free(guard_slot_t *slot)
{
    int done = 0;
    return slot->req == MPI_REQUEST_NULL ||
           (PMPI_Test(&slot->req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done);
}

static int mpi_guard_send(const void *msg, size_t len, int dest)
{
    int rc = -1;
    if (len > DPS_GUARD_MSG_MAX || dest < 0 || dest >= npeers) return -1;
    pthread_mutex_lock(&guard_slots_lock);
    for (int i = 0; i < GUARD_SLOTS_PER_PEER; i++) {
        guard_slot_t **slot = &guard_slots[(size_t)dest * GUARD_SLOTS_PER_PEER + (size_t)i];
        if (!*slot && (*slot = malloc(sizeof **slot)) != NULL) (*slot)->req = MPI_REQUEST_NULL;
        if (!*slot) break;
        if (!slot_free(*slot)) continue;
        memcpy((*slot)->buf, msg, len);
        rc = PMPI_Isend((*slot)->buf, (int)len, MPI_BYTE, dest, 0, guard_comm, &(*slot)->req) == MPI_SUCCESS
                 ? 0
                 : -1;
        break;
    }
    pthread_mutex_unlock(&guard_slots_lock);
    return rc;
}

/* Sends still in flight at the end go to peers that never took them: cancelled, so that freeing
 * the communicator and MPI_Finalize do not wait for them. */
static void drop_guard_sends(void)
{
    pthread_mutex_lock(&guard_slots_lock);
    for (size_t i = 0; i < (size_t)npeers * GUARD_SLOTS_PER_PEER; i++)
        if (guard_slots[i] && !slot_free(guard_slots[i])) {
            PMPI_Cancel(&guard_slots[i]->req);
            PMPI_Request_free(&guard_slots[i]->req);
        }
    pthread_mutex_unlock(&guard_slots_lock);
}

static int mpi_guard_poll(void *msg, size_t len, int *src)
{
    int flag = 0;
    MPI_Status st;
    if (PMPI_Iprobe(MPI_ANY_SOURCE, 0, guard_comm, &flag, &st) != MPI_SUCCESS) return -1;
    if (!flag) return 0;
    if (PMPI_Recv(msg, (int)len, MPI_BYTE, st.MPI_SOURCE, 0, guard_comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return -1;
    *src = st.MPI_SOURCE;
    return 1;
}

/* The desync checks' comparisons (one or two numbers, before every collective with [guard]
 * desync = full) go through shared memory where the data's small sums do; the choice follows
 * the count, which each call site fixes, so every rank takes the same path. */
#define GUARD_SHM_COUNT 2

static int mpi_guard_min_u64(uint64_t *v, size_t n)
{
    char err[256];
    if (guard_shm && n <= GUARD_SHM_COUNT)
        return dps_shm_sum(guard_shm, v, (int)n, DP_I64, MPI_UINT64_T, MPI_MIN, DPS_RED_MIN, sizeof *v, 1.0,
                           1.0, err, sizeof err);
    return PMPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_UINT64_T, MPI_MIN, guard_comm) == MPI_SUCCESS ? 0 : -1;
}

static int mpi_guard_allgather(const void *mine, void *all, size_t bytes)
{
    return PMPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, guard_comm) == MPI_SUCCESS
               ? 0
               : -1;
}

/* The file policy's channel: rank 0 tells every other rank the outcome of each operation on a
 * gated path, in order, on a communicator of its own (tag 0). Rank 0's sends never block (it
 * keeps the requests and frees those done at its next send); the others wait for the next
 * message. The others' acknowledgements go to rank 0 with tag 1. After a loss, the lowest
 * survivor leads in rank 0's place and tells the other survivors (mpi_set_survivors). */
typedef struct files_send {
    MPI_Request req;
    unsigned char buf[DPS_FILES_MSG_MAX];
} files_send_t;
static files_send_t *files_sends;
static size_t nfiles_sends, cap_files_sends;

static int mpi_files_post(const void *msg, size_t len)
{
    int size = 0, rc = 0;
    PMPI_Comm_size(files_comm, &size);
    if (len > DPS_FILES_MSG_MAX) return -1;
    pthread_mutex_lock(&files_lock);
    if (files_targets) size = nfiles_targets + 1; /* after a loss: the survivors */
    size_t kept = 0;                              /* the sends still in flight move to the front */
    for (size_t i = 0; i < nfiles_sends; i++) {
        int done = 0;
        if (PMPI_Test(&files_sends[i].req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done)
            memmove(&files_sends[kept++], &files_sends[i], sizeof *files_sends);
    }
    nfiles_sends = kept;
    if (nfiles_sends + (size_t)size > cap_files_sends) {
        size_t c = 2 * (nfiles_sends + (size_t)size);
        files_send_t *p = realloc(files_sends, c * sizeof *p);
        if (!p)
            rc = -1;
        else
            files_sends = p, cap_files_sends = c;
    }
    for (int i = 1; i < size && rc == 0; i++) {
        files_send_t *s = &files_sends[nfiles_sends];
        int r = files_targets ? files_targets[i - 1] : i;
        memcpy(s->buf, msg, len);
        if (PMPI_Isend(s->buf, (int)len, MPI_BYTE, r, 0, files_comm, &s->req) != MPI_SUCCESS)
            rc = -1;
        else
            nfiles_sends++;
    }
    pthread_mutex_unlock(&files_lock);
    return rc;
}

static int mpi_files_wait(void *msg, size_t len)
{
    return PMPI_Recv(msg, (int)len, MPI_BYTE, atomic_load(&files_leader), 0, files_comm, MPI_STATUS_IGNORE) ==
                   MPI_SUCCESS
               ? 0
               : -1;
}

static int mpi_files_poll(void *msg, size_t len)
{
    int ready = 0;
    if (PMPI_Iprobe(atomic_load(&files_leader), 0, files_comm, &ready, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return -1;
    return ready ? (mpi_files_wait(msg, len) == 0 ? 1 : -1) : 0;
}

static int mpi_files_ack(const void *msg, size_t len)
{
    return PMPI_Send(msg, (int)len, MPI_BYTE, atomic_load(&files_leader), 1, files_comm) == MPI_SUCCESS ? 0
                                                                                                        : -1;
}

static int mpi_files_next_ack(void *msg, size_t len, int *src)
{
    MPI_Status st;
    for (unsigned polls = 0; abandon_fn; polls++) { /* elastic mode: given up at a loss */
        int ready = 0;
        if (PMPI_Iprobe(MPI_ANY_SOURCE, 1, files_comm, &ready, &st) != MPI_SUCCESS) return -1;
        if (ready) break;
        if (abandon_fn()) return DPS_BACKEND_ABANDONED;
        if (polls > 4096) {
            struct timespec nap = {0, 50000};
            nanosleep(&nap, NULL);
        }
    }
    if (PMPI_Recv(msg, (int)len, MPI_BYTE, abandon_fn ? st.MPI_SOURCE : MPI_ANY_SOURCE, 1, files_comm, &st) !=
        MPI_SUCCESS)
        return -1;
    *src = st.MPI_SOURCE;
    return 0;
}

/* Outcomes no rank received (they took another path, or left): dropped at release. */
static void drop_files_sends(void)
{
    pthread_mutex_lock(&files_lock);
    for (size_t i = 0; i < nfiles_sends; i++) {
        int done = 0;
        if (PMPI_Test(&files_sends[i].req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) continue;
        PMPI_Cancel(&files_sends[i].req);
        PMPI_Request_free(&files_sends[i].req);
    }
    nfiles_sends = 0;
    pthread_mutex_unlock(&files_lock);
}

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Rank 0 answers each measuring rank's pings in turn with its clock; the ping with the shortest
 * round trip bounds the error best. Point-to-point on the main communicator, apart from its
 * collectives by the tag. */
static int mpi_clock_offset(const unsigned char *measure, int64_t *offset_ns, uint64_t *error_ns)
{
    enum { ROUNDS = 8, TAG = 7 };
    int rank = 0, size = 0;
    PMPI_Comm_rank(main_ch.comm, &rank);
    PMPI_Comm_size(main_ch.comm, &size);
    *offset_ns = 0, *error_ns = 0;
    int64_t t;
    for (int r = 1; rank == 0 && r < size; r++)
        for (int i = 0; measure[r] && i < ROUNDS; i++) {
            if (check(&main_ch, PMPI_Recv(&t, 1, MPI_INT64_T, r, TAG, main_ch.comm, MPI_STATUS_IGNORE),
                      "MPI_Recv"))
                return -1;
            t = wall_ns();
            if (check(&main_ch, PMPI_Send(&t, 1, MPI_INT64_T, r, TAG, main_ch.comm), "MPI_Send")) return -1;
        }
    uint64_t best = UINT64_MAX;
    for (int i = 0; rank != 0 && measure[rank] && i < ROUNDS; i++) {
        int64_t sent = wall_ns();
        if (check(&main_ch, PMPI_Send(&sent, 1, MPI_INT64_T, 0, TAG, main_ch.comm), "MPI_Send") ||
            check(&main_ch, PMPI_Recv(&t, 1, MPI_INT64_T, 0, TAG, main_ch.comm, MPI_STATUS_IGNORE),
                  "MPI_Recv"))
            return -1;
        int64_t back = wall_ns();
        if ((uint64_t)(back - sent) < best)
            best = (uint64_t)(back - sent), *offset_ns = sent + (back - sent) / 2 - t;
    }
    if (best != UINT64_MAX) *error_ns = best / 2;
    return 0;
}

static void mpi_release(void)
{
    int fin = 0;
    PMPI_Finalized(&fin);
    if (guard_comm != MPI_COMM_NULL && !fin) drop_guard_sends();
    if (files_comm != MPI_COMM_NULL && !fin) drop_files_sends();
    free(main_ch.block), free(bg_ch.block), free(main_ch.map);
    main_ch.map = NULL;
    dps_shm_sum_close(main_ch.shm), dps_shm_sum_close(bg_ch.shm), dps_shm_sum_close(guard_shm);
    main_ch.shm = bg_ch.shm = guard_shm = NULL;
    main_ch.block = bg_ch.block = NULL, main_ch.block_bytes = bg_ch.block_bytes = 0;
    MPI_Comm *comms[] = {&main_ch.comm, &bg_ch.comm, &guard_comm, &files_comm};
    for (size_t i = 0; i < sizeof comms / sizeof *comms; i++) {
        if (*comms[i] != MPI_COMM_NULL && !fin) PMPI_Comm_free(comms[i]);
        *comms[i] = MPI_COMM_NULL;
    }
}

static void mpi_finalize(void)
{
    mpi_release();
    int fin = 0;
    PMPI_Finalized(&fin);
    if (initialized_by_us && !fin) PMPI_Finalize();
}

static int mpi_owns_init(void)
{
    return initialized_by_us;
}

__attribute__((visibility("default"))) int dps_plugin_open_v1(int expect_rank, int expect_size,
                                                              dps_backend_t *out, char *err, size_t errlen)
{
    int init = 0, fin = 0, provided = 0, rank = -1, size = -1;
    PMPI_Initialized(&init);
    PMPI_Finalized(&fin);
    if (fin) {
        snprintf(err, errlen, "mpi backend: the program already called MPI_Finalize");
        return -1;
    }
    if (!init) {
        if (check(&main_ch, PMPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread"))
            goto fail;
        initialized_by_us = 1;
    }
    if (check(&main_ch, PMPI_Comm_dup(MPI_COMM_WORLD, &main_ch.comm), "MPI_Comm_dup")) goto fail;
    if (PMPI_Type_contiguous(2, MPI_BYTE, &half_type) != MPI_SUCCESS ||
        PMPI_Type_commit(&half_type) != MPI_SUCCESS ||
        PMPI_Op_create(f16_sum_fn, 1, &f16_sum) != MPI_SUCCESS ||
        PMPI_Op_create(bf16_sum_fn, 1, &bf16_sum) != MPI_SUCCESS ||
        PMPI_Op_create(u8_sum_fn, 1, &u8_sum) != MPI_SUCCESS) {
        snprintf(main_ch.err, sizeof main_ch.err,
                 "cannot create the half-precision type and the sums of our own");
        goto fail;
    }
    PMPI_Comm_set_errhandler(main_ch.comm, MPI_ERRORS_RETURN);
    if (init) PMPI_Query_thread(&provided);
    /* the guard and the progress thread work while the main thread waits in a collective */
    int threads = provided == MPI_THREAD_MULTIPLE;
    int guard = threads && PMPI_Comm_dup(MPI_COMM_WORLD, &guard_comm) == MPI_SUCCESS;
    int bg = threads && PMPI_Comm_dup(MPI_COMM_WORLD, &bg_ch.comm) == MPI_SUCCESS;
    /* file operations come from any thread of the program, at any time */
    int files = threads && PMPI_Comm_dup(MPI_COMM_WORLD, &files_comm) == MPI_SUCCESS;
    if (guard) PMPI_Comm_set_errhandler(guard_comm, MPI_ERRORS_RETURN);
    if (files) PMPI_Comm_set_errhandler(files_comm, MPI_ERRORS_RETURN);
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    if (guard && (guard_slots = calloc((size_t)size * GUARD_SLOTS_PER_PEER, sizeof *guard_slots)) == NULL)
        guard = 0;
    npeers = guard ? size : 0;
    if (bg) PMPI_Comm_set_errhandler(bg_ch.comm, MPI_ERRORS_RETURN);
    PMPI_Comm_rank(main_ch.comm, &rank);
    PMPI_Comm_size(main_ch.comm, &size);
    main_ch.rank = bg_ch.rank = rank,
    main_ch.size = bg_ch.size = size; /* the dups keep MPI_COMM_WORLD's ranks */
    if (rank != expect_rank || size != expect_size) {
        snprintf(err, errlen,
                 "mpi backend: MPI says rank %d of %d, the launcher said rank %d of %d; start the "
                 "program with the MPI that libdpshim-mpi.so was built against (mpirun from the "
                 "same Open MPI)",
                 rank, size, expect_rank, expect_size);
        mpi_finalize();
        return -1;
    }
    *out = (dps_backend_t){.name = "mpi",
                           .allreduce = mpi_allreduce,
                           .bcast = mpi_bcast,
                           .barrier = mpi_barrier,
                           .last_error = mpi_last_error,
                           .release = mpi_release,
                           .finalize = mpi_finalize,
                           .owns_mpi_init = mpi_owns_init,
                           .guard_send = guard ? mpi_guard_send : NULL,
                           .guard_poll = guard ? mpi_guard_poll : NULL,
                           .guard_min_u64 = guard ? mpi_guard_min_u64 : NULL,
                           .guard_allgather = guard ? mpi_guard_allgather : NULL,
                           .allreduce_bg = bg ? mpi_allreduce_bg : NULL,
                           .last_error_bg = mpi_last_error_bg,
                           .files_post = files ? mpi_files_post : NULL,
                           .files_wait = files ? mpi_files_wait : NULL,
                           .files_poll = files ? mpi_files_poll : NULL,
                           .files_ack = files ? mpi_files_ack : NULL,
                           .files_next_ack = files ? mpi_files_next_ack : NULL,
                           .set_sizes = mpi_set_sizes,
                           .set_abandon = threads ? mpi_set_abandon : NULL,
                           .set_survivors = mpi_set_survivors,
                           .replay = mpi_replay,
                           .clock_offset = mpi_clock_offset,
                           .tuning = mpi_tuning};
    return 0;
fail:
    snprintf(err, errlen, "mpi backend: %s", main_ch.err);
    return -1;
}
