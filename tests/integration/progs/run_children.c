/* A rank process that calls ft_1 of libffi_targets.so (so that a [hook] declaring it binds here),
 * may change directory, then runs each command with system(): what a program that chdir()s and
 * the children it starts get from the shim.  usage: run_children [-C DIR] [CMD...] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int32_t ft_1(int32_t a);

int main(int argc, char **argv)
{
    int a = 1, failed = 0;
    if (ft_1(1) != 4) return fprintf(stderr, "run_children: ft_1(1) is not 4\n"), 2;
    if (a + 1 < argc && !strcmp(argv[a], "-C")) {
        if (chdir(argv[a + 1]) != 0) return perror(argv[a + 1]), 2;
        a += 2;
    }
    for (; a < argc; a++) {
        fflush(stdout); /* the child's output after ours, in order */
        int st = system(argv[a]);
        int code = st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        printf("run_children: '%s' exited %d\n", argv[a], code);
        failed |= code != 0;
    }
    return failed;
}
