/* A rank process with DataLoader-style workers: forked children, a vfork+exec child and a
 * system() child call collectives too. They must act alone (world size 1) and never block or
 * break the parent's job, whose own collectives go on working. "wrapped": one collective, as a
 * trainer a wrapper starts; "child-first": a system() child calls a hook before this process
 * does.  usage: fork_workers [child | wrapped | child-first] */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

static double sum_of_ones(void)
{
    double v = 1;
    dp_metric(&v, 1, DP_SUM);
    return v;
}

static int wait_ok(pid_t pid)
{
    int st;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv)
{
    if (!dp_metric) return 2;
    if (argc > 1 && !strcmp(argv[1], "child")) return sum_of_ones() == 1 ? 0 : 3; /* exec'd child */
    if (argc > 1 && !strcmp(argv[1], "wrapped")) { /* started by a wrapper: it holds the rank's place */
        printf("fork_workers wrapped rank %d: sum %g\n", dp_rank(), sum_of_ones());
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "child-first")) { /* a child calls a hook before this process */
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "'%s' wrapped", argv[0]);
        if (system(cmd) != 0) return 4;
        sum_of_ones(); /* the child holds the rank's place now: the job ends here */
        return 0;
    }
    int size = dp_world_size(), ok = sum_of_ones() == size;
    pid_t workers[3];
    for (int k = 0; k < 3; k++)
        if ((workers[k] = fork()) == 0) exit(sum_of_ones() == 1 ? 0 : 3); /* exit(): atexit runs */
    for (int k = 0; k < 3; k++)
        ok &= wait_ok(workers[k]);
    pid_t v = vfork();
    if (v == 0) {
        execl(argv[0], argv[0], "child", (char *)NULL);
        _exit(127);
    }
    ok &= wait_ok(v);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "'%s' child", argv[0]);
    ok &= system(cmd) == 0;
    ok &= sum_of_ones() == size; /* the parent is still a full member of the job */
    printf("fork_workers rank %d: %s\n", dp_rank(), ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
