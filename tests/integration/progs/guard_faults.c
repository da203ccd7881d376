/* A training loop on the hook ABI with one fault injected, for the guard's tests.
 *   guard_faults STEPS [FAULT RANK STEP]
 * FAULT: exit (return from main early), stall (sleep forever inside the step), crash (SIGSEGV),
 * extra (one more all-reduce than the others), scope (a collective inside a rank-0 scope),
 * perturb (change one parameter after the update, as a nondeterministic kernel would),
 * linger (after the last step, RANK keeps working alone for STEP seconds).
 * With GUARD_FAULTS_ANNOUNCE=1 in the environment the gradient is larger (70 000 floats) and
 * announced by dp_grad_ready first, so it is reduced by the shim's progress thread. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

int main(int argc, char **argv)
{
    if (argc < 2 || !dp_grads) {
        fprintf(stderr, "usage: guard_faults STEPS [exit|stall|crash|extra|scope|perturb|linger RANK STEP] (under the shim)\n");
        return 2;
    }
    int steps = atoi(argv[1]), rank = dp_rank(), size = dp_world_size();
    const char *fault = argc > 4 ? argv[2] : "";
    int frank = argc > 4 ? atoi(argv[3]) : -1, fstep = argc > 4 ? atoi(argv[4]) : -1;
    static float w[70000], g[70000];
    const char *announce = getenv("GUARD_FAULTS_ANNOUNCE");
    int n = announce && !strcmp(announce, "1") ? 70000 : 1000;
    dp_tensor tw = {w, (uint64_t)n, DP_F32, DP_HOST, "w"}, tg = {g, (uint64_t)n, DP_F32, DP_HOST, "w.grad"};
    dp_params(&tw, 1);
    for (int s = 1; s <= steps; s++) {
        int here = rank == frank && s == fstep;
        if (here && !strcmp(fault, "exit")) {
            printf("rank %d leaves at step %d\n", rank, s);
            return 0;
        }
        if (here && !strcmp(fault, "crash")) raise(SIGSEGV);
        if (here && !strcmp(fault, "stall"))
            for (;;) pause();
        for (int i = 0; i < n; i++) g[i] = (float)(rank + 1);
        if (n > 1000) dp_grad_ready(&tg);
        dp_grads(&tg, 1);
        if (here && !strcmp(fault, "extra")) {
            double v = 1;
            dp_metric(&v, 1, DP_SUM);
        }
        if (!strcmp(fault, "scope") && s == fstep && dp_scope_begin("save")) {
            double v = 7;
            dp_metric(&v, 1, DP_SUM); /* rank 0 alone: must not block, must give 7 */
            if (v != 7) {
                fprintf(stderr, "scope collective gave %g\n", v);
                return 1;
            }
            printf("rank %d: collective inside the scope gave %g\n", rank, v);
        }
        if (!strcmp(fault, "scope") && s == fstep) dp_scope_end();
        for (int i = 0; i < n; i++) w[i] -= 0.01f * g[i];
        if (here && !strcmp(fault, "perturb")) w[17] += 1e-3f;
        dp_step_end((uint64_t)s);
        usleep(20000);
    }
    double v = 1;
    dp_metric(&v, 1, DP_SUM);
    printf("rank %d finished %d steps, %g ranks\n", rank, steps, v);
    if (!strcmp(fault, "linger") && rank == frank) sleep((unsigned)fstep);
    return v == size ? 0 : 1;
}
