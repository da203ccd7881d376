/* [output] stdout: rank0 points other ranks' standard output at /dev/null; prefix puts a pipe
 * in front of it and a thread that writes whole lines tagged "[r3] ", one write(2) per batch
 * of complete lines, so lines of different ranks never tear. stderr is never touched. Children
 * inherit the redirected descriptor, so their output follows the same rule. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dps.h"
#include "files/files.h"

/* The original stdout, kept across exec so that a rank process replacing itself (a wrapper
 * script's `exec`) can put its own pipe in front of the real one again. */
#define DPS_ENV_STDOUT_FD "DPSHIM_STDOUT_FD"

static struct {
    int out;    /* where tagged lines go */
    int pipe_r; /* what the program writes, read by the thread */
    pthread_t thread;
    int running;
    char tag[24];
    size_t taglen;
} pre = {.out = -1, .pipe_r = -1};

static void write_all(int fd, const char *b, size_t n)
{
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        b += w, n -= (size_t)w;
    }
}

static void *prefix_thread(void *arg)
{
    (void)arg;
    enum { IN = 1 << 16 };
    static char in[IN], out[2 * IN];
    size_t have = 0;
    for (;;) {
        ssize_t r = read(pre.pipe_r, in + have, IN - have);
        if (r < 0 && errno == EINTR) continue;
        int eof = r <= 0;
        have += eof ? 0 : (size_t)r;
        /* emit every complete line; at EOF or with a full buffer, the rest too */
        size_t start = 0, o = 0;
        for (size_t i = 0; i < have; i++)
            if (in[i] == '\n' || (i + 1 == have && (eof || have == IN))) {
                if (o + pre.taglen + (i + 2 - start) > sizeof out) write_all(pre.out, out, o), o = 0;
                memcpy(out + o, pre.tag, pre.taglen), o += pre.taglen;
                memcpy(out + o, in + start, i + 1 - start), o += i + 1 - start;
                if (in[i] != '\n') out[o++] = '\n';
                start = i + 1;
            }
        if (o) write_all(pre.out, out, o);
        memmove(in, in + start, have - start);
        have -= start;
        if (eof) return NULL;
    }
}

static int setup_prefix(int rank)
{
    const char *kept = getenv(DPS_ENV_STDOUT_FD);
    int out = kept ? atoi(kept) : -1;
    if (out < 3 || fcntl(out, F_GETFD) < 0) {
        out = fcntl(STDOUT_FILENO, F_DUPFD, 10);
        if (out < 0) return -1;
        char v[16];
        snprintf(v, sizeof v, "%d", out);
        setenv(DPS_ENV_STDOUT_FD, v, 1);
    }
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return -1;
    if (dup2(p[1], STDOUT_FILENO) < 0) return -1; /* fd 1 stays open across exec */
    close(p[1]);
    pre.out = out, pre.pipe_r = p[0];
    pre.taglen = (size_t)snprintf(pre.tag, sizeof pre.tag, "[r%d] ", rank);
    if (pthread_create(&pre.thread, NULL, prefix_thread, NULL) != 0) {
        dup2(out, STDOUT_FILENO);
        return -1;
    }
    pre.running = 1;
    return 0;
}

int dps_output_setup(const dps_state_t *s)
{
    const dps_policy_t *p = &s->policy;
    if (dps_policy_is(p, DPS_P_output_stdout, "rank0") && s->rank != 0) {
        int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0) return -1;
        close(fd);
    } else if (dps_policy_is(p, DPS_P_output_stdout, "prefix")) {
        dps_in_shim++;
        int rc = setup_prefix(s->rank);
        dps_in_shim--;
        if (rc != 0) return -1;
    }
    return 0;
}

/* At exit: flush, stop writing into the pipe, and let the thread drain it. Children that
 * still hold the pipe keep it open; the thread is given a moment, not forever. */
void dps_output_shutdown(void)
{
    if (!pre.running || atomic_load(&dps_g.forked)) return;
    fflush(stdout);
    dup2(pre.out, STDOUT_FILENO);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 2;
    if (pthread_timedjoin_np(pre.thread, NULL, &deadline) == 0) pre.running = 0;
}
