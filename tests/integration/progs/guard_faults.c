/* A training loop on the hook ABI with one fault injected, for the guard's tests.
 *   guard_faults STEPS [FAULT RANK STEP]
 * FAULT: exit (return from main early), stall (sleep forever inside the step), crash (SIGSEGV),
 * kill (SIGKILL: no handler runs, as under the OOM killer; a STEP past the last one: after the final
 * sum, while the others wait at the exit barrier), stop (SIGSTOP: every thread frozen,
 * the watchdog's too, as a node that stops answering),
 * extra (one more all-reduce than the others), scope (a collective inside a rank-0 scope),
 * perturb (change one parameter after the update, as a nondeterministic kernel would),
 * linger (after the last step, RANK keeps working alone for STEP seconds), early (RANK returns
 * from main before its first hook call), swap (the gradient goes as two tensors, 400 + 600
 * elements, and RANK passes them as 600 + 400), count (RANK's gradient has 1200 elements, the
 * others' 1000), threads (RANK calls dp_metric from two threads at once, 400 times each, where
 * the others call it 800 times from one), vanish (RANK leaves through _exit(0) before its first
 * hook call, which no exit handler sees), late (RANK sleeps STEP seconds before its first hook),
 * temp (every rank gives dp_params a temporary copy of the parameters, freed at once, as a
 * framework's contiguous copies are), slow (from step STEP on, RANK computes 30 ms longer than
 * the others each step: a straggler).
 * With GUARD_FAULTS_ANNOUNCE=1 in the environment the gradient is larger (70 000 floats) and
 * announced by dp_grad_ready first, so it is reduced by the shim's progress thread. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

/* threads: each of two threads sums its own value 400 times; a rank's sums must be exact */
static pthread_barrier_t both_ready;

static void *metric_loop(void *arg)
{
    pthread_barrier_wait(&both_ready);
    int bad = 0;
    for (int i = 0; i < 400; i++) {
        double v = 1;
        dp_metric(&v, 1, DP_SUM);
        bad += v != dp_world_size();
    }
    (void)arg;
    return (void *)(intptr_t)bad;
}

static int two_threads(void)
{
    pthread_t a, b;
    void *bad_a, *bad_b;
    pthread_barrier_init(&both_ready, NULL, 2);
    pthread_create(&a, NULL, metric_loop, NULL);
    pthread_create(&b, NULL, metric_loop, NULL);
    pthread_join(a, &bad_a), pthread_join(b, &bad_b);
    return (int)(intptr_t)bad_a + (int)(intptr_t)bad_b;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !dp_grads) {
        fprintf(stderr, "usage: guard_faults STEPS "
                        "[exit|stall|crash|kill|stop|extra|scope|perturb|linger|early|vanish|late|swap|count|"
                        "threads|temp|slow RANK STEP] (under the shim)\n");
        return 2;
    }
    int steps = atoi(argv[1]), rank = dp_rank(), size = dp_world_size();
    const char *fault = argc > 4 ? argv[2] : "";
    int frank = argc > 4 ? atoi(argv[3]) : -1, fstep = argc > 4 ? atoi(argv[4]) : -1;
    static float w[70000], g[70000];
    /* GUARD_FAULTS_ANNOUNCE=1: a large gradient, announced by dp_grad_ready; GUARD_FAULTS_LARGE=1: a
     * large gradient (reduced in place, by the mpi backend's ring) through dp_grads alone */
    const char *announce = getenv("GUARD_FAULTS_ANNOUNCE"), *large = getenv("GUARD_FAULTS_LARGE");
    int n = (announce && !strcmp(announce, "1")) || (large && !strcmp(large, "1")) ? 70000 : 1000;
    dp_tensor tw = {w, (uint64_t)n, DP_F32, DP_HOST, "w"}, tg = {g, (uint64_t)n, DP_F32, DP_HOST, "w.grad"};
    if (rank == frank && !strcmp(fault, "vanish")) _exit(0);
    if (rank == frank && !strcmp(fault, "late")) sleep((unsigned)fstep);
    if (rank == frank && !strcmp(fault, "early")) {
        printf("rank %d leaves before its first hook call\n", rank);
        return 0;
    }
    if (!strcmp(fault, "temp")) {
        float *copy = malloc(sizeof w); /* large: malloc maps it, free unmaps it */
        memcpy(copy, w, sizeof w);
        dp_tensor tc = {copy, (uint64_t)n, DP_F32, DP_HOST, "w (a copy)"};
        dp_params(&tc, 1);
        memcpy(w, copy, sizeof w);
        free(copy);
    }
    dp_params(&tw, 1);
    for (int s = 1; s <= steps; s++) {
        int here = rank == frank && s == fstep;
        if (here && !strcmp(fault, "exit")) {
            printf("rank %d leaves at step %d\n", rank, s);
            return 0;
        }
        if (here && !strcmp(fault, "crash")) raise(SIGSEGV);
        if (here && !strcmp(fault, "kill")) raise(SIGKILL);
        if (here && !strcmp(fault, "stop")) raise(SIGSTOP);
        if (here && !strcmp(fault, "stall"))
            for (;;)
                pause();
        if (rank == frank && s >= fstep && !strcmp(fault, "slow")) usleep(30000);
        for (int i = 0; i < n; i++)
            g[i] = (float)(rank + 1);
        if (announce && !strcmp(announce, "1")) dp_grad_ready(&tg);
        if (!strcmp(fault, "swap")) {
            /* the same 1000 elements as two tensors; rank RANK lists them the other way round at STEP */
            dp_tensor two[2] = {{g, 400, DP_F32, DP_HOST, "a.grad"},
                                {g + 400, 600, DP_F32, DP_HOST, "b.grad"}};
            if (here)
                two[0] = (dp_tensor){g, 600, DP_F32, DP_HOST, "b.grad"},
                two[1] = (dp_tensor){g + 600, 400, DP_F32, DP_HOST, "a.grad"};
            dp_grads(two, 2);
        } else if (here && !strcmp(fault, "count")) {
            dp_tensor other = {g, n == 1000 ? 1200 : 68000, DP_F32, DP_HOST, "w.grad"};
            dp_grads(&other, 1);
        } else {
            dp_grads(&tg, 1);
        }
        if (here && !strcmp(fault, "threads")) {
            int bad = two_threads();
            printf("rank %d: %d of 800 sums from two threads were wrong\n", rank, bad);
        } else if (!strcmp(fault, "threads") && s == fstep) {
            for (int i = 0; i < 800; i++) {
                double v = 1;
                dp_metric(&v, 1, DP_SUM);
            }
        }
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
        for (int i = 0; i < n; i++)
            w[i] -= 0.01f * g[i];
        if (here && !strcmp(fault, "perturb")) w[17] += 1e-3f;
        dp_step_end((uint64_t)s);
        usleep(20000);
    }
    double v = 1;
    dp_metric(&v, 1, DP_SUM);
    printf("rank %d finished %d steps, %g ranks\n", rank, steps, v);
    if (!strcmp(fault, "linger") && rank == frank) sleep((unsigned)fstep);
    if (!strcmp(fault, "kill") && rank == frank && fstep > steps) raise(SIGKILL);
    return v == size ? 0 : 1;
}
