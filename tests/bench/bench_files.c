/* open + write + close of one path, N times: the cost the file interposers add to a path the
 * policy does not match, or to a rank0_only one under mpirun. With "load", each save goes to
 * PATH.tmp, is renamed over PATH and read back (open + read + close), as a program that saves
 * and then loads its checkpoint does. Prints nanoseconds per iteration.
 *   usage: bench_files N PATH [load] */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

static int fail(const char *what, const char *path, long i)
{
    fprintf(stderr, "bench_files: %s %s, iteration %ld: %s\n", what, path, i, strerror(errno));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3 && !(argc == 4 && !strcmp(argv[3], "load"))) return 2;
    long n = atol(argv[1]);
    int load = argc == 4;
    char buf[64] = "0123456789012345678901234567890123456789012345678901234567890\n", back[64];
    double one = 1; /* under the shim: a job's first collective comes before its files */
    if (dp_metric) dp_metric(&one, 1, DP_SUM);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[2]);
    for (long i = 0; i < n; i++) {
        int fd = open(load ? tmp : argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, buf, sizeof buf) != sizeof buf || close(fd) != 0)
            return fail("save", argv[2], i);
        if (!load) continue;
        if (rename(tmp, argv[2]) != 0) return fail("rename", argv[2], i);
        fd = open(argv[2], O_RDONLY);
        if (fd < 0 || read(fd, back, sizeof back) != sizeof back || close(fd) != 0)
            return fail("load", argv[2], i);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)n);
    unlink(argv[2]);
    return 0;
}
