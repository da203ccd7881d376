/* The hooks with tensors in GPU memory, checked against the host path in the same process:
 * every rank puts the same rank-dependent values into device tensors and into host copies,
 * calls the hook on both, and compares. Built against the CUDA test double (CI) and, where the
 * CUDA toolkit is found, against the real runtime (gpu-check on a GPU machine).
 *
 *   gpu_hooks [--hook grads|ready|params|bn|owners] [--dtype f32|f64|f16|bf16|i32|i64|u8|all]
 *             [--batch N] [--nan-if-empty] [--late] [--stream] [--capture] [--unflagged] [--steps K]
 *             [--sleep-rank R] [--kill-rank R] [--host-first] [--mixed]
 *
 * --hook owners: dp_from_owners with tensor i owned by rank (i + 1) % size; the host copies are
 *         also checked against the owner's own values.
 * --batch N: split mode's global batch (dp_batch), so shares and weights are uneven.
 * --late: the values reach device memory by an asynchronous copy on the producing stream just
 *         before the hook, behind other queued work (with the double's delay, a collective that
 *         does not wait reads stale data). --stream: the program's work runs on a stream of its own named by dp_set_stream.
 * --unflagged: device tensors passed as DP_HOST (the shim must find out where they live).
 * --sleep-rank R: rank R sleeps 120 s before its second step's hooks, while the others' GPU
 *         collectives wait for it (the guard must end the job).
 * --kill-rank R: rank R SIGKILLs itself before its second step's hooks (elastic mode: the others
 *         go on without it).
 * --host-first: dp_grads on the host tensors before the device ones (the reference is then
 *         reduced among the ranks of the step's start, as a GPU sum replayed after a loss is).
 * --mixed: one dp_grads call with the device and the host tensors together.
 * --capture: the hook is called while the stream is captured into a CUDA graph (refused).
 * --device local: the rank works on the GPU of its local rank (cudaSetDevice), as a program
 *         that picks cuda:LOCAL_RANK itself (run with [gpu] bind = off and several GPUs visible).
 * --current D: the tensors are made on that GPU, but device D is current when the hooks run.
 * --capture-after: after the first step's hooks, while their work may still be queued, the
 *         program captures a memset on a stream of its own in global mode for 600 ms (the
 *         default of torch.cuda.graph); the capture must stay valid.
 * Prints "gpu_hooks rank R: <hook> <dtype> checksum <hex> ok" per dtype; exits 1 on a mismatch. */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

/* The CUDA runtime calls used here, declared as the runtime exports them. */
typedef void *cudaStream_t;
int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
int cudaMemcpy(void *dst, const void *src, size_t n, int kind);
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t s);
int cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s);
int cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
int cudaStreamSynchronize(cudaStream_t s);
int cudaStreamBeginCapture(cudaStream_t s, int mode);
int cudaStreamEndCapture(cudaStream_t s, void **graph);
int cudaSetDevice(int dev);
int cudaDeviceSynchronize(void);
int cudaHostAlloc(void **p, size_t n, unsigned flags);
enum { H2D = 1, D2H = 2 };

static int rank, size, failures;

/* Tensor sizes: tiny, bucketed, empty, and one that goes in place (256 KiB and more). */
static const uint64_t counts[] = {3, 1000, 0, 17, 70000};
#define NT (sizeof counts / sizeof *counts)

static size_t dsize(int dt)
{
    return dt == DP_F64 || dt == DP_I64 ? 8 : dt == DP_F32 || dt == DP_I32 ? 4 : dt == DP_U8 ? 1 : 2;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact for the small integers used here */
}

/* Small integers, exact in every dtype, and their sums over 4 ranks too. */
static void fill(void *p, int dt, uint64_t n, int i, int nan)
{
    for (uint64_t j = 0; j < n; j++) {
        double v = nan ? NAN : (double)((rank + 1) * 3 + i + (int)(j % 7));
        switch (dt) {
        case DP_F32:
            ((float *)p)[j] = (float)v;
            break;
        case DP_F64:
            ((double *)p)[j] = v;
            break;
        case DP_F16: {
            _Float16 h = (_Float16)v;
            memcpy((uint16_t *)p + j, &h, 2);
            break;
        }
        case DP_BF16:
            ((uint16_t *)p)[j] = to_bf16((float)v);
            break;
        case DP_I32:
            ((int32_t *)p)[j] = (int32_t)(nan ? -1 : v);
            break;
        case DP_I64:
            ((int64_t *)p)[j] = (int64_t)(nan ? -1 : v);
            break;
        default:
            ((uint8_t *)p)[j] = (uint8_t)(nan ? 255 : v);
        }
    }
}

static double value(const void *p, int dt, uint64_t j)
{
    switch (dt) {
    case DP_F32:
        return ((const float *)p)[j];
    case DP_F64:
        return ((const double *)p)[j];
    case DP_F16: {
        _Float16 h;
        memcpy(&h, (const uint16_t *)p + j, 2);
        return h;
    }
    case DP_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[j] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case DP_I32:
        return ((const int32_t *)p)[j];
    case DP_I64:
        return (double)((const int64_t *)p)[j];
    default:
        return ((const uint8_t *)p)[j];
    }
}

static const char *dnames[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};

int main(int argc, char **argv)
{
    const char *hook = "grads", *dtype = "all";
    int batch = 0, nan_if_empty = 0, late = 0, use_stream = 0, capture = 0, unflagged = 0, steps = 1,
        sleep_rank = -1, kill_rank = -1, host_first = 0, mixed = 0;
    int local_device = 0, current = -1, capture_after = 0;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--hook") && a + 1 < argc)
            hook = argv[++a];
        else if (!strcmp(argv[a], "--dtype") && a + 1 < argc)
            dtype = argv[++a];
        else if (!strcmp(argv[a], "--batch") && a + 1 < argc)
            batch = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--steps") && a + 1 < argc)
            steps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--sleep-rank") && a + 1 < argc)
            sleep_rank = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--kill-rank") && a + 1 < argc)
            kill_rank = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--nan-if-empty"))
            nan_if_empty = 1;
        else if (!strcmp(argv[a], "--host-first"))
            host_first = 1;
        else if (!strcmp(argv[a], "--mixed"))
            mixed = 1;
        else if (!strcmp(argv[a], "--late"))
            late = 1;
        else if (!strcmp(argv[a], "--stream"))
            use_stream = 1;
        else if (!strcmp(argv[a], "--capture"))
            capture = 1;
        else if (!strcmp(argv[a], "--unflagged"))
            unflagged = 1;
        else if (!strcmp(argv[a], "--device") && a + 1 < argc && !strcmp(argv[a + 1], "local"))
            local_device = 1, a++;
        else if (!strcmp(argv[a], "--current") && a + 1 < argc)
            current = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--capture-after"))
            capture_after = 1;
        else {
            fprintf(stderr, "gpu_hooks: unknown argument %s\n", argv[a]);
            return 2;
        }
    }
    rank = dp_rank ? dp_rank() : 0;
    size = dp_world_size ? dp_world_size() : 1;
    int device = local_device && dp_local_rank ? dp_local_rank() : 0;
    if (local_device && cudaSetDevice(device) != 0)
        return fprintf(stderr, "cudaSetDevice(%d) failed\n", device), 1;
    cudaStream_t stream = NULL; /* NULL: the legacy default stream */
    if (use_stream && cudaStreamCreateWithFlags(&stream, 1) != 0) return fprintf(stderr, "no stream\n"), 1;
    if (use_stream && dp_set_stream) dp_set_stream(device, stream);
    void *scratch = NULL;
    if (late && cudaMalloc(&scratch, 1) != 0) return fprintf(stderr, "cudaMalloc failed\n"), 1;
    int empty_share = 0;
    if (batch) {
        uint64_t idx[4096];
        for (int j = 0; j < batch; j++)
            idx[j] = (uint64_t)j;
        empty_share = dp_batch(idx, (size_t)batch) == 0;
    }
    for (int step = 0; step < steps; step++) {
        if (step == 1 && rank == sleep_rank) sleep(120);
        if (step == 1 && rank == kill_rank) raise(SIGKILL);
        for (int dt = 0; dt < 7; dt++) {
            if (strcmp(dtype, "all") && strcmp(dtype, dnames[dt])) continue;
            if (!strcmp(hook, "bn") && dt != DP_F32 && dt != DP_F64) continue;
            dp_tensor dev[NT], host[NT];
            void *staging[NT];
            /* work queued ahead of the producing copies, so they finish well after the hook */
            for (int k = 0; late && k < 4; k++)
                cudaMemsetAsync(scratch, 0, 1, stream);
            for (size_t i = 0; i < NT; i++) {
                size_t bytes = counts[i] * dsize(dt);
                host[i] = (dp_tensor){malloc(bytes + 1), counts[i], dt, DP_HOST, "host"};
                if (cudaHostAlloc(&staging[i], bytes + 1, 0) != 0)
                    return fprintf(stderr, "no pinned memory\n"), 1;
                fill(host[i].data, dt, counts[i], (int)i, nan_if_empty && empty_share);
                memcpy(staging[i], host[i].data, bytes);
                void *d = NULL;
                if (cudaMalloc(&d, bytes + 1) != 0) return fprintf(stderr, "cudaMalloc failed\n"), 1;
                dev[i] = (dp_tensor){d, counts[i], dt, unflagged ? DP_HOST : device, "dev"};
                if (!late)
                    cudaMemcpy(d, staging[i], bytes, H2D);
                else
                    cudaMemcpyAsync(d, staging[i], bytes, H2D, stream);
            }
            if (!late) cudaDeviceSynchronize();
            if (capture) cudaStreamBeginCapture(stream, 0);
            if (current >= 0 && cudaSetDevice(current) != 0)
                return fprintf(stderr, "cudaSetDevice(%d) failed\n", current), 1;
            int rc = 0;
            if (!strcmp(hook, "grads") && mixed) {
                dp_tensor both[2 * NT];
                for (size_t i = 0; i < NT; i++)
                    both[2 * i] = dev[i], both[2 * i + 1] = host[i];
                rc = dp_grads(both, 2 * NT);
            } else if (!strcmp(hook, "grads") && host_first)
                rc = dp_grads(host, NT) | dp_grads(dev, NT);
            else if (!strcmp(hook, "grads"))
                rc = dp_grads(dev, NT) | dp_grads(host, NT);
            else if (!strcmp(hook, "params"))
                rc = dp_params(dev, NT) | dp_params(host, NT);
            else if (!strcmp(hook, "owners")) {
                int32_t owner[NT];
                for (size_t i = 0; i < NT; i++)
                    owner[i] = (int32_t)((i + 1) % (size_t)size);
                rc = dp_from_owners(dev, NT, owner) | dp_from_owners(host, NT, owner);
                for (size_t i = 0; i < NT; i++)
                    for (uint64_t j = 0; j < counts[i]; j++)
                        if (value(host[i].data, dt, j) !=
                            (double)((owner[i] + 1) * 3 + (int)i + (int)(j % 7))) {
                            fprintf(stderr, "rank %d: owners %s tensor %zu element %llu is not rank %d's\n",
                                    rank, dnames[dt], i, (unsigned long long)j, owner[i]);
                            failures++;
                            break;
                        }
            } else if (!strcmp(hook, "ready")) {
                for (size_t i = NT; i-- > 0;)
                    rc |= dp_grad_ready(&dev[i]);
                rc |= dp_grads(dev, NT) | dp_grads(host, NT);
            } else if (!strcmp(hook, "bn")) {
                uint64_t c1 = (uint64_t)rank + 5, c2 = c1;
                rc = dp_bn_stats(&dev[1], &dev[3], &c1) | dp_bn_stats(&host[1], &host[3], &c2);
                if (c1 != c2)
                    fprintf(stderr, "rank %d: bn count %llu vs %llu\n", rank, (unsigned long long)c1,
                            (unsigned long long)c2),
                        failures++;
            }
            if (rc) fprintf(stderr, "rank %d: a hook returned %d\n", rank, rc), failures++;
            if (current >= 0) cudaSetDevice(device);
            if (capture_after && step == 0) {
                cudaStream_t cap;
                void *graph = NULL, *buf = NULL;
                int e = cudaStreamCreateWithFlags(&cap, 1) || cudaMalloc(&buf, 64) ||
                        cudaStreamBeginCapture(cap, 0);
                if (!e)
                    cudaMemsetAsync(buf, 0, 64, cap), usleep(600 * 1000),
                        e = cudaStreamEndCapture(cap, &graph);
                if (e || !graph)
                    fprintf(stderr, "rank %d: the program's CUDA graph capture failed (error %d)\n", rank, e),
                        failures++;
            }
            if (use_stream) cudaStreamSynchronize(stream);
            uint64_t h = 1469598103934665603ull;
            int bad = 0;
            for (size_t i = 0; i < NT; i++) {
                size_t bytes = counts[i] * dsize(dt);
                unsigned char *back = malloc(bytes + 1);
                cudaMemcpy(back, dev[i].data, bytes, D2H);
                /* dp_bn_stats reduces tensors 1 and 3 only: the others keep each rank's values */
                int reduced = strcmp(hook, "bn") || i == 1 || i == 3;
                for (size_t b = 0; reduced && b < bytes; b++)
                    h = (h ^ back[b]) * 1099511628211ull;
                for (uint64_t j = 0; j < counts[i] && bad < 5; j++) {
                    double got = value(back, dt, j), want = value(host[i].data, dt, j);
                    /* the host path scales in double; NCCL's pre-multiplied sum in the dtype */
                    double tol = dt == DP_F32    ? 4e-7 * fabs(want)
                                 : dt == DP_F16  ? 2e-3 * fabs(want)
                                 : dt == DP_BF16 ? 1.6e-2 * fabs(want)
                                 : dt == DP_F64  ? 1e-15 * fabs(want)
                                                 : 0;
                    if (!(fabs(got - want) <= tol) || isnan(got)) {
                        fprintf(stderr, "rank %d: %s %s tensor %zu element %llu: GPU %.9g, host %.9g\n", rank,
                                hook, dnames[dt], i, (unsigned long long)j, got, want);
                        bad++;
                    }
                }
                free(back);
                free(host[i].data);
                cudaFree(dev[i].data);
            }
            failures += bad;
            printf("gpu_hooks rank %d: %s %s checksum %016llx %s\n", rank, hook, dnames[dt],
                   (unsigned long long)h, bad ? "MISMATCH" : "ok");
            if (dp_step_end) dp_step_end((uint64_t)step);
        }
    }
    return failures ? 1 : 0;
}
