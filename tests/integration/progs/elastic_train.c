/* A training loop on the hook ABI for the elastic tests: each rank's gradient is (the rank it
 * started as + 1) everywhere, a small tensor (packed in a bucket) and a large one (reduced in
 * place), so the average says which ranks took part in each step.
 *   elastic_train STEPS [KILL_RANK KILL_STEP [before|during|save|load|stall|stop|start]]
 * KILL_RANK dies with SIGKILL at step KILL_STEP: before its gradients go out, or (during) from a
 * thread while the gradient sum runs (on a busy machine up to three steps later), or (save)
 * halfway through writing that step's checkpoint, or (load) as every rank reads the last
 * checkpoint back before saving the next (each step from the second on); or it stalls there in
 * its own code (stall: sleeps for ever; stop: SIGSTOP); or (start) it dies before the start-up
 * broadcast of the weights (KILL_STEP unused). At the end each rank prints its ranks, the two
 * weights' first elements and a checksum of all of them, and dp_metric's count of ranks; then the
 * job's size as dp_world_size() answered at the start of each step (every survivor must see the
 * same).
 * ELASTIC_TRAIN_STEPS=1 prints each step's gradients; ELASTIC_TRAIN_PROGRESS=1 prints a line per
 * step on stdout, "step S:" before the step (and its kill) and " done" after its gradient sum;
 * ELASTIC_TRAIN_SLEEP_MS=N sleeps N ms a step;
 * ELASTIC_TRAIN_LATE=R:MS: rank R enters step KILL_STEP's gradient sum MS ms after the others, so
 * that another survivor's guard finds the stalled rank first.
 * ELASTIC_TRAIN_SAVE=DIR: DIR/train.log, open from the start, gets "step S" after each step, and
 * DIR/w.ckpt the weights (made anew each step); at the end each rank reads w.ckpt back and prints
 * its checksum (for [files] rank0_only). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

enum { SMALL = 1000, LARGE = 300000 };

static uint64_t checksum(const void *p, size_t n)
{
    uint64_t sum = 1469598103934665603ull;
    for (size_t i = 0; i + 4 <= n; i += 4) {
        uint32_t b;
        memcpy(&b, (const char *)p + i, sizeof b);
        sum = (sum ^ b) * 1099511628211ull;
    }
    return sum;
}

/* In pieces, as a serializer writes; die_halfway: SIGKILL after the first half. Through a
 * temporary and a rename where a reader may still read the last one (in place, a reader would see
 * the file shrink under it). */
static void save(const char *dir, const char *name, const void *p, size_t n, int die_halfway, int via_temp)
{
    char path[4096], temp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(temp, sizeof temp, "%s/next.%s", dir, name);
    FILE *f = fopen(via_temp ? temp : path, "wb");
    for (size_t at = 0, piece = 64 << 10; f && at < n; at += piece) {
        if (die_halfway && at >= n / 2) raise(SIGKILL);
        if (fwrite((const char *)p + at, 1, n - at < piece ? n - at : piece, f) == 0) break;
    }
    if (!f || ferror(f) || fclose(f) != 0 || (via_temp && rename(temp, path) != 0)) {
        perror(path);
        exit(1);
    }
}

static void *kill_soon(void *arg)
{
    (void)arg;
    usleep(2000);
    raise(SIGKILL);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !dp_grads) {
        fprintf(stderr, "usage: elastic_train STEPS [KILL_RANK KILL_STEP "
                        "[before|during|save|load|stall|stop|start]], under "
                        "libdpshim.so\n");
        return 2;
    }
    int steps = atoi(argv[1]), kill_rank = argc > 3 ? atoi(argv[2]) : -1,
        kill_step = argc > 3 ? atoi(argv[3]) : -1;
    const char *how = argc > 4 ? argv[4] : "before";
    int during = !strcmp(how, "during");
    int start_rank = dp_rank(), start_size = dp_world_size();
    static float w[SMALL + LARGE], g[SMALL + LARGE];
    dp_tensor tw[2] = {{w, SMALL, DP_F32, DP_HOST, "small"}, {w + SMALL, LARGE, DP_F32, DP_HOST, "large"}};
    dp_tensor tg[2] = {{g, SMALL, DP_F32, DP_HOST, "small.grad"},
                       {g + SMALL, LARGE, DP_F32, DP_HOST, "large.grad"}};
    if (start_rank == kill_rank && !strcmp(how, "start")) raise(SIGKILL); /* before the start-up broadcast */
    dp_params(tw, 2);
    const char *dir = getenv("ELASTIC_TRAIN_SAVE");
    char logpath[4096];
    int log = -1;
    if (dir) {
        snprintf(logpath, sizeof logpath, "%s/train.log", dir);
        if ((log = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) {
            perror(logpath);
            return 1;
        }
    }
    char sizes[4096] = "";
    size_t sizes_len = 0;
    pthread_t killer;
    int killing = 0;
    int progress = getenv("ELASTIC_TRAIN_PROGRESS") != NULL;
    for (int s = 1; s <= steps; s++) {
        if (progress) printf("step %d:", s);
        if (sizes_len < sizeof sizes)
            sizes_len +=
                (size_t)snprintf(sizes + sizes_len, sizeof sizes - sizes_len, " %d", dp_world_size());
        if (start_rank == kill_rank && s == kill_step) {
            if (!strcmp(how, "stall"))
                for (;;)
                    pause();
            if (!strcmp(how, "stop")) raise(SIGSTOP);
            if (!strcmp(how, "before")) raise(SIGKILL);
            if (during) killing = pthread_create(&killer, NULL, kill_soon, NULL) == 0;
        }
        /* a busy machine may run the thread late: the rank dies three steps later at the latest,
         * not after the job's last step */
        if (killing && s == kill_step + 3) pthread_join(killer, NULL);
        int late_rank = -1, late_ms = 0;
        if (s == kill_step && getenv("ELASTIC_TRAIN_LATE") &&
            sscanf(getenv("ELASTIC_TRAIN_LATE"), "%d:%d", &late_rank, &late_ms) == 2 &&
            late_rank == start_rank)
            usleep((useconds_t)late_ms * 1000);
        for (int i = 0; i < SMALL + LARGE; i++)
            g[i] = (float)(start_rank + 1);
        dp_grads(tg, 2);
        if (progress) printf(" done\n");
        for (int i = 0; i < SMALL + LARGE; i++)
            w[i] -= 0.01f * g[i];
        if (getenv("ELASTIC_TRAIN_STEPS"))
            fprintf(stderr, "rank %d step %d: small %g large %g\n", start_rank, s, (double)g[0],
                    (double)g[SMALL]);
        dp_step_end((uint64_t)s);
        char line[32];
        int len = snprintf(line, sizeof line, "step %d\n", s);
        if (log >= 0 && write(log, line, (size_t)len) != len) {
            perror(logpath);
            return 1;
        }
        if (dir && s > 1 && !strcmp(how, "load")) {
            if (start_rank == kill_rank && s == kill_step) raise(SIGKILL);
            static float back[SMALL + LARGE];
            char path[4096];
            snprintf(path, sizeof path, "%s/w.ckpt", dir);
            FILE *f = fopen(path, "rb");
            size_t got = f ? fread(back, 1, sizeof back, f) : 0;
            if (!f || got != sizeof back || fclose(f) != 0) {
                fprintf(stderr, "rank %d, step %d: read %zu bytes of %s: %s\n", start_rank, s, got, path,
                        f ? "short" : strerror(errno));
                return 1;
            }
        }
        if (dir)
            save(dir, "w.ckpt", w, sizeof w,
                 start_rank == kill_rank && s == kill_step && !strcmp(how, "save"), !strcmp(how, "load"));
        if (getenv("ELASTIC_TRAIN_SLEEP_MS"))
            usleep((useconds_t)atoi(getenv("ELASTIC_TRAIN_SLEEP_MS")) * 1000);
    }
    double ranks = 1;
    dp_metric(&ranks, 1, DP_SUM);
    uint64_t sum = checksum(w, sizeof w);
    if (log >= 0 && close(log) != 0) {
        perror(logpath);
        return 1;
    }
    if (dir) { /* the checkpoint as the file holds it */
        static float back[SMALL + LARGE];
        char path[4096];
        snprintf(path, sizeof path, "%s/w.ckpt", dir);
        FILE *f = fopen(path, "rb");
        size_t got = f ? fread(back, 1, sizeof back + 1, f) : 0;
        if (f) fclose(f);
        printf("rank %d: checkpoint %zu bytes, checksum %016llx\n", start_rank, got,
               (unsigned long long)checksum(back, got));
    }
    printf("rank %d of %d (started as %d of %d): small %.9g large %.9g checksum %016llx, %g ranks\n",
           dp_rank(), dp_world_size(), start_rank, start_size, (double)w[0], (double)w[SMALL],
           (unsigned long long)sum, ranks);
    printf("rank %d sizes:%s\n", dp_rank(), sizes);
    return 0;
}
