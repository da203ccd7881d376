/* What the preload costs a process that is not the trainer (a shell, a compiler, a DataLoader
 * worker's exec): PROGRAM started in blocks of 50, plainly and with LD_PRELOAD=LIB in turn (as a
 * training job's scripts start one command after another), each block timed from the first
 * posix_spawn to the last waitpid.
 *   bench_exec LIB N PROGRAM [ARGS...]   N blocks each; prints "plain_us shim_us", the medians
 *                                        of the blocks' time per start */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void start_once(char **argv, char **envp)
{
    pid_t pid;
    if (posix_spawn(&pid, argv[0], NULL, NULL, argv, envp) != 0) {
        perror("bench_exec: posix_spawn");
        exit(1);
    }
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st)) {
        fprintf(stderr, "bench_exec: %s did not exit normally\n", argv[0]);
        exit(1);
    }
}

enum { BLOCK = 50 };

/* Microseconds per start over one block. */
static double block(char **argv, char **envp)
{
    double t0 = now_us();
    for (int i = 0; i < BLOCK; i++) start_once(argv, envp);
    return (now_us() - t0) / BLOCK;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_exec LIB N PROGRAM [ARGS...]\n");
        return 2;
    }
    int n = atoi(argv[2]);
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **plain = calloc(ne + 1, sizeof *plain), **shim = calloc(ne + 2, sizeof *shim);
    size_t np = 0, ns = 0;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0) plain[np++] = shim[ns++] = environ[i];
    char pre[4200];
    snprintf(pre, sizeof pre, "LD_PRELOAD=%s", argv[1]);
    shim[ns++] = pre;
    double *a = calloc((size_t)n, sizeof *a), *b = calloc((size_t)n, sizeof *b);
    block(argv + 3, plain), block(argv + 3, shim); /* warm the page cache */
    for (int i = 0; i < n; i++) {
        a[i] = block(argv + 3, plain);
        b[i] = block(argv + 3, shim);
    }
    qsort(a, (size_t)n, sizeof *a, cmp);
    qsort(b, (size_t)n, sizeof *b, cmp);
    printf("%.1f %.1f\n", a[n / 2], b[n / 2]);
    return 0;
}
