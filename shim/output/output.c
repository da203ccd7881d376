/* [output] stdout: rank0 points other ranks' standard output at /dev/null; prefix puts a pipe
 * in front of it, read by a small helper process that writes whole lines tagged "[r3] ", one
 * write(2) per batch of complete lines, so lines of different ranks never tear. stderr is never
 * touched. Children inherit the redirected descriptor, so their output follows the same rule.
 * The reader is a process, not a thread: it must outlive a rank process that leaves with _exit
 * (shells do) or replaces itself with exec, and it drains what children still write. It is a
 * grandchild, so a program that waits for all its children never waits for it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "output.h"
#include "core/sys.h"

/* Launchers forward each rank's output in reads of a few KiB and merge ranks at read
 * boundaries. Written into an empty pipe, a batch of whole lines of at most PIPE_BUF bytes is
 * read whole, so its lines stay whole in the merged output. Open MPI gives ranks a
 * pseudo-terminal instead, whose reader can see a batch in pieces when it falls behind: there
 * small batches make a split rare but not impossible (docs/limits.md). */
#define DPS_OUT_BATCH 1024

static int out_is_pipe;

/* Waits until the reader has taken everything from the output when it is a pipe. */
static void wait_drained(int fd)
{
    int queued;
    while (out_is_pipe && ioctl(fd, FIONREAD, &queued) == 0 && queued > 0)
        usleep(50);
}

static void write_all(int fd, const char *b, size_t n)
{
    while (n) {
        ssize_t w = dps_sys_write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        b += w, n -= (size_t)w;
    }
}

/* The helper's whole life: tag lines from `in` onto `out` until every writer is gone. */
static _Noreturn void prefix_loop(int in, int out, const char *tag, size_t taglen)
{
    enum { IN = 1 << 16 };
    static char buf[IN], res[DPS_OUT_BATCH];
    size_t have = 0;
    struct stat st;
    out_is_pipe = fstat(out, &st) == 0 && S_ISFIFO(st.st_mode);
    for (;;) {
        ssize_t r = read(in, buf + have, IN - have);
        if (r < 0 && errno == EINTR) continue;
        int eof = r <= 0;
        have += eof ? 0 : (size_t)r;
        /* every complete line; at EOF or with a full buffer, the rest as a line too */
        size_t start = 0, o = 0;
        for (size_t i = 0; i < have; i++)
            if (buf[i] == '\n' || (i + 1 == have && (eof || have == IN))) {
                size_t len = i + 1 - start, need = taglen + len + (buf[i] != '\n');
                if (o && o + need > sizeof res) wait_drained(out), write_all(out, res, o), o = 0;
                if (need > sizeof res) { /* a very long line: alone, in pieces */
                    wait_drained(out);
                    write_all(out, tag, taglen), write_all(out, buf + start, len);
                    if (buf[i] != '\n') write_all(out, "\n", 1);
                } else {
                    memcpy(res + o, tag, taglen), o += taglen;
                    memcpy(res + o, buf + start, len), o += len;
                    if (buf[i] != '\n') res[o++] = '\n';
                }
                start = i + 1;
            }
        if (o) wait_drained(out), write_all(out, res, o);
        memmove(buf, buf + start, have - start);
        have -= start;
        if (eof) _exit(0);
    }
}

static int setup_prefix(int rank)
{
    char tag[24];
    size_t taglen = (size_t)snprintf(tag, sizeof tag, "[r%d] ", rank);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return -1;
    pid_t mid = fork();
    if (mid < 0) return dps_sys_close(p[0]), dps_sys_close(p[1]), -1;
    if (mid == 0) {
        /* the intermediate child: start the helper and leave, so init adopts it */
        if (fork() == 0) {
            dps_sys_close(p[1]);
            prefix_loop(p[0], STDOUT_FILENO, tag, taglen);
        }
        _exit(0);
    }
    int st;
    while (waitpid(mid, &st, 0) < 0 && errno == EINTR) {
    }
    dps_sys_close(p[0]);
    int rc = dup2(p[1], STDOUT_FILENO) < 0 ? -1 : 0; /* fd 1 stays open across exec */
    dps_sys_close(p[1]);
    return rc;
}

/* A wrapper (/usr/bin/time -v) writes its report when its trainer ends, to unbuffered stderr,
 * one character per write. The exit barrier ends every rank's trainer at the same moment, so
 * every rank's wrapper writes at once, and the launcher, which merges the ranks' streams at the
 * boundaries of its reads, interleaves their characters: lines come out torn, and a search for
 * one misses a rank (about 1 run in 3 at np = 2). Made line buffered, each of its lines is one
 * write of at most PIPE_BUF bytes, which a reader takes whole. Only a wrapper: a trainer's own
 * stderr stays unbuffered (a progress bar redrawn with '\r', a message just before a crash). */
/* line buffered, or known to be no wrapper's; read by every stderr write, of children too */
DPS_STARTUP_DATA static atomic_int stderr_decided;

void dps_output_wrapper_stderr(void)
{
    if (DPS_LIKELY(atomic_load_explicit(&stderr_decided, memory_order_relaxed))) return;
    if (dps_g.role != DPS_ROLE_RANK || dps_g.size < 2 ||
        atomic_load_explicit(&dps_g.forked, memory_order_relaxed)) {
        atomic_store(&stderr_decided, 1);
        return;
    }
    int owner = dps_rank_owner();
    if (!owner) return; /* nobody holds the place yet: asked again at the next write */
    if (owner != (int)getpid() && !atomic_exchange(&stderr_decided, 1)) {
        static char buf[PIPE_BUF];
        setvbuf(stderr, buf, _IOLBF, sizeof buf);
    }
    atomic_store(&stderr_decided, 1);
}

/* The launcher's stdout on a rank that [output] stdout = rank0 silenced, kept for
 * dps_output_take_over; -1: none. */
static int silenced_stdout = -1;
/* A silenced stdout that comes back where rank 0 is lost (elastic mode) is buffered until then as
 * rank 0's is: line by line, where the launcher gives the ranks a terminal (Open MPI's
 * pseudo-terminal), also Python's (dpshim_stdout_may_return). So what waits in the buffer when it
 * comes back is the line under way, which the new output then completes, and not whole lines the
 * old rank 0 printed already (its own line under way went with its process). */
static int may_return;

DPS_EXPORT int dpshim_stdout_may_return(void)
{
    return may_return && silenced_stdout >= 0;
}

int dps_output_take_over(void)
{
    if (silenced_stdout < 0) {
        errno = EBADF;
        return -1;
    }
    /* what was written before goes where it was meant to: nowhere; a line under way stays */
    if (!__flbf(stdout)) dps_sys_fflush(stdout);
    int rc = dup2(silenced_stdout, STDOUT_FILENO) < 0 ? -1 : 0;
    dps_sys_close(silenced_stdout), silenced_stdout = -1;
    return rc;
}

int dps_output_setup(const dps_state_t *s)
{
    const dps_policy_t *p = &s->policy;
    if (s->exec_in_place) return 0; /* the process it replaced set stdout up already */
    if (DPS_POLICY_ENUM(p, output, stdout) == DPS_V_output_stdout_rank0 && s->rank != 0) {
        int fd = dps_sys_open("/dev/null", O_WRONLY | O_CLOEXEC, 0);
        /* kept out of the program's low descriptors, closed at exec */
        silenced_stdout = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 100);
        if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0) return -1;
        dps_sys_close(fd);
        may_return = dps_job_may_go_on(s) && isatty(silenced_stdout);
        if (may_return) setvbuf(stdout, NULL, _IOLBF, BUFSIZ);
    } else if (DPS_POLICY_ENUM(p, output, stdout) == DPS_V_output_stdout_prefix) {
        dps_sys_fflush(stdout);
        return setup_prefix(s->rank);
    }
    return 0;
}
