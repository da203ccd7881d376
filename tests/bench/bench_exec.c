/* What the preload costs a process that is not the trainer (a shell, a compiler, a DataLoader
 * worker's exec): PROGRAM started in blocks of 50, plainly and with LD_PRELOAD=LIB for each LIB in
 * turn, round after round (as a training job's scripts start one command after another), each
 * block timed from the first posix_spawn to the last waitpid. A round's ratio is a LIB's block
 * over the plain block of the same round, so that the machine's drift between rounds (other
 * users, frequency) cancels out.
 *   bench_exec N LIB... -- PROGRAM [ARGS...]   N rounds; prints a line "plain US", then a line per
 *                                              LIB: "LIB US RATIO LOW HIGH", US the median of the
 *                                              blocks' time per start, RATIO the median of the
 *                                              rounds' ratios, LOW and HIGH their 10th and 90th
 *                                              percentiles */
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
    for (int i = 0; i < BLOCK; i++)
        start_once(argv, envp);
    return (now_us() - t0) / BLOCK;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile of v[0..n) (sorted in place), nearest rank. */
static double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

int main(int argc, char **argv)
{
    int sep = 2;
    while (sep < argc && strcmp(argv[sep], "--"))
        sep++;
    int n = argc > 1 ? atoi(argv[1]) : 0, nlibs = sep - 2;
    if (n < 1 || nlibs < 1 || sep + 1 >= argc) {
        fprintf(stderr, "usage: bench_exec N LIB... -- PROGRAM [ARGS...]\n");
        return 2;
    }
    char **prog = argv + sep + 1;
    size_t ne = 0;
    while (environ[ne])
        ne++;
    /* envs[0]: plain, without any LD_PRELOAD; envs[1 + k]: LD_PRELOAD=argv[2 + k] */
    char ***envs = calloc((size_t)nlibs + 1, sizeof *envs);
    for (int k = 0; k <= nlibs; k++) {
        envs[k] = calloc(ne + 2, sizeof **envs);
        size_t m = 0;
        for (size_t i = 0; i < ne; i++)
            if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0) envs[k][m++] = environ[i];
        if (k) {
            size_t len = strlen(argv[1 + k]) + sizeof "LD_PRELOAD=";
            envs[k][m] = malloc(len);
            snprintf(envs[k][m], len, "LD_PRELOAD=%s", argv[1 + k]);
        }
    }
    double *t = calloc((size_t)(nlibs + 1) * (size_t)n, sizeof *t), *r = calloc((size_t)n, sizeof *r);
    for (int k = 0; k <= nlibs; k++)
        block(prog, envs[k]); /* warm the page cache */
    for (int i = 0; i < n; i++)
        for (int k = 0; k <= nlibs; k++)
            t[k * n + i] = block(prog, envs[k]);
    printf("plain %.1f\n", quantile(memcpy(r, t, (size_t)n * sizeof *r), n, 0.5));
    for (int k = 1; k <= nlibs; k++) {
        for (int i = 0; i < n; i++)
            r[i] = t[k * n + i] / t[i];
        double lo = quantile(r, n, 0.1), mid = quantile(r, n, 0.5), hi = quantile(r, n, 0.9);
        printf("%s %.1f %.3f %.3f %.3f\n", argv[1 + k], quantile(t + k * n, n, 0.5), mid, lo, hi);
    }
    return 0;
}
