/* A preload for the elastic tests that places a rank's loss at a chosen point inside the ring
 * all-reduce (the survivors' collectives after a loss, and large sums), where a SIGKILL from the
 * program's own code cannot reach. It counts a
 * rank's point-to-point sends of more than 64 KiB (the ring's blocks: nothing else the shim sends
 * is as large):
 *   RING_STOP=RANK:N        once rank RANK's point-to-point send N is complete (its right
 *                           neighbour in the ring has the block) and the receive of the same ring
 *                           step is not, the rank stops. Its right neighbour completes the sum;
 *                           its left one waits for its own send to it. The ring posts each step's
 *                           receive, then its send, and waits for both with MPI_Testall.
 *   RING_LATE=RANK:N:MS     rank RANK posts its send N MS ms late (so that the rank that stops has
 *                           not received it yet).
 *   METRIC_STOP=RANK:N      rank RANK stops as it makes its Nth dp_metric call after the job lost
 *                           a rank (dp_world_size() below its size at the first call): inside an
 *                           adapter's own sums of the recovery, say.
 * A rank that stops gets SIGSTOP (no progress, MPI's included) and dies by SIGKILL 0.5 s later.
 * Ranks are Open MPI's (OMPI_COMM_WORLD_RANK). Preloaded before libdpshim.so, so that the MPI
 * backend's calls and the adapters' hook calls reach it first. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The setting NAME=RANK:N[:MS] where RANK is this process's rank; 0 where it is not. */
static int setting(const char *name, int *n, int *ms)
{
    const char *spec = getenv(name), *me = getenv("OMPI_COMM_WORLD_RANK");
    int rank;
    *ms = 0;
    return spec && me && sscanf(spec, "%d:%d:%d", &rank, n, ms) >= 2 && rank == atoi(me);
}

/* Counts the sends of more than 64 KiB: this one's number among them, 0 for a small one. */
static int large(int *calls, int count, MPI_Datatype type)
{
    int size = 0;
    PMPI_Type_size(type, &size);
    return (long)count * size > (64 << 10) ? ++*calls : 0;
}

static void stop(const char *where)
{
    fprintf(stderr, "ring_faults: rank %s stops in %s\n", getenv("OMPI_COMM_WORLD_RANK"), where);
    pid_t self = getpid();
    if (fork() == 0) {
        usleep(500000);
        kill(self, SIGKILL);
        _exit(0);
    }
    raise(SIGSTOP);
}

static MPI_Request stop_after; /* the send RING_STOP names, once posted */
static int stop_armed;

int PMPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
               MPI_Request *req)
{
    static int (*real)(const void *, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request *);
    static int calls;
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "PMPI_Isend");
    int n, ms, this_one = large(&calls, count, type);
    if (this_one && setting("RING_LATE", &n, &ms) && n == this_one) usleep((useconds_t)ms * 1000);
    int rc = real(buf, count, type, dest, tag, comm, req);
    if (this_one && setting("RING_STOP", &n, &ms) && n == this_one) stop_after = *req, stop_armed = 1;
    return rc;
}

int PMPI_Testall(int count, MPI_Request reqs[], int *flag, MPI_Status st[])
{
    static int (*real)(int, MPI_Request[], int *, MPI_Status[]);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "PMPI_Testall");
    int rc = real(count, reqs, flag, st), sent = 0;
    if (stop_armed && !*flag && count == 2 && reqs[1] == stop_after &&
        PMPI_Request_get_status(reqs[1], &sent, MPI_STATUS_IGNORE) == MPI_SUCCESS && sent)
        stop("the ring step of its send");
    return rc;
}

int dp_metric(double *v, size_t n, int op)
{
    static int (*real)(double *, size_t, int), (*world_size)(void), first_size, calls;
    if (!real) {
        *(void **)&real = dlsym(RTLD_NEXT, "dp_metric");
        *(void **)&world_size = dlsym(RTLD_NEXT, "dp_world_size");
    }
    int size = world_size(), at, ms;
    if (!first_size) first_size = size;
    if (size < first_size && setting("METRIC_STOP", &at, &ms) && ++calls == at)
        stop("a dp_metric after the loss");
    return real(v, n, op);
}
