/* open + write + close of one path, N times: the cost the file interposers add to a path the
 * policy does not match. Prints nanoseconds per iteration.  usage: bench_files N PATH */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 3) return 2;
    long n = atol(argv[1]);
    char buf[64] = "0123456789012345678901234567890123456789012345678901234567890\n";
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, buf, sizeof buf) != sizeof buf || close(fd) != 0) return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)n);
    unlink(argv[2]);
    return 0;
}
