/* Writes lines in pieces with pauses in the middle of lines, from a forked child and then from
 * the rank process, so [output] stdout = prefix must reassemble them: every line printed is
 * "[rR] rank R <who> line I " followed by a run of 'x'. (Two processes of one rank writing
 * partial lines at the same moment interleave in their shared stdout, as without the shim.)
 * usage: out_torture LINES */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

static void lines(int rank, const char *who, int n)
{
    char head[96], tail[300];
    for (int i = 0; i < n; i++) {
        int h = snprintf(head, sizeof head, "rank %d %s line %d ", rank, who, i);
        int t = 1 + (i * 37) % 250;
        memset(tail, 'x', (size_t)t);
        tail[t] = '\n';
        if (write(1, head, (size_t)h) != h) exit(1);
        if (i % 50 == 0) usleep(2000); /* a torn line would show now */
        if (write(1, tail, (size_t)t + 1) != t + 1) exit(1);
    }
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 500, rank = dp_rank ? dp_rank() : 0;
    pid_t pid = fork();
    if (pid == 0) {
        lines(rank, "child", n);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    lines(rank, "parent", n);
    printf("rank %d stdio line %s\n", rank, "xx");
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
