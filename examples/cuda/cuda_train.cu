/* cuda_train: a single-GPU trainer (a 2-layer MLP on synthetic data) that knows nothing of MPI.
 * It calls the hook ABI through weak symbols, so `mpirun -np N env LD_PRELOAD=libdpshim.so
 * cuda_train` trains data-parallel (split mode) and ends with the parameters of the run alone,
 * up to float rounding: the same global batches, with the ranks' gradients averaged.
 *
 * --save PATH file: "CUDATRN1", u32 D, u32 H, u32 C, u32 steps (little-endian), then float32
 * little-endian W1[D][H], b1[H], W2[H][C], b2[C]. The checksum printed at the end is the 64-bit
 * FNV-1a hash of those float bytes (the header excluded). */
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DPSHIM_HOOKS_WEAK
#include <dpshim/hooks.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the --save format writes host floats as little-endian"
#endif

/* Every CUDA call is checked: file:line, the call, and CUDA's words; the program cannot go on. */
#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "cuda_train: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                        \
                    cudaGetErrorString(e_));                                                                 \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

/* One thread per output element; a launch of nothing is skipped (an empty share is legal). */
#define TPB 256
#define LAUNCH(kernel, count, st, ...)                                                                       \
    do {                                                                                                     \
        size_t n_ = (count);                                                                                 \
        if (n_) {                                                                                            \
            kernel<<<(unsigned)((n_ + TPB - 1) / TPB), TPB, 0, (st)>>>(__VA_ARGS__);                         \
            CK(cudaGetLastError());                                                                          \
        }                                                                                                    \
    } while (0)
#define TID(t, count)                                                                                        \
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                                                \
    if (t >= (count)) return

/* Every reduction below is a plain loop in one thread, in a fixed order: no atomics, so a run
 * is bitwise repeatable and the only difference between 1 and N ranks is the gradient average. */

/* h[i][j] = relu(b1[j] + sum_d x[idx[i]][d] * w1[d][j]) */
__global__ void k_hidden(const float *x, const uint64_t *idx, const float *w1, const float *b1, float *h,
                         size_t n, size_t D, size_t H)
{
    TID(t, n * H);
    size_t i = t / H, j = t % H;
    const float *xi = x + idx[i] * D;
    float s = b1[j];
    for (size_t d = 0; d < D; d++) s += xi[d] * w1[d * H + j];
    h[t] = s > 0.0f ? s : 0.0f;
}

/* z[i][c] = b2[c] + sum_j h[i][j] * w2[j][c] */
__global__ void k_logits(const float *h, const float *w2, const float *b2, float *z, size_t n, size_t H,
                         size_t C)
{
    TID(t, n * C);
    size_t i = t / C, c = t % C;
    float s = b2[c];
    for (size_t j = 0; j < H; j++) s += h[i * H + j] * w2[j * C + c];
    z[t] = s;
}

/* Per sample: cross-entropy, and dz = (softmax - onehot) / n, the gradient of the share's mean. */
__global__ void k_softmax(const float *z, const int32_t *y, const uint64_t *idx, float *dz, double *loss,
                          size_t n, size_t C)
{
    TID(i, n);
    const float *zi = z + i * C;
    float mx = zi[0];
    for (size_t c = 1; c < C; c++) mx = fmaxf(mx, zi[c]);
    double den = 0.0;
    for (size_t c = 0; c < C; c++) den += exp((double)(zi[c] - mx));
    int32_t yi = y[idx[i]];
    for (size_t c = 0; c < C; c++)
        dz[i * C + c] = (float)((exp((double)(zi[c] - mx)) / den - (c == (size_t)yi)) / (double)n);
    loss[i] = log(den) - (double)(zi[yi] - mx);
}

/* *out = sum_i v[i], in one thread: slow for large n, but always the same order */
__global__ void k_sum(const double *v, size_t n, double *out)
{
    if (blockIdx.x || threadIdx.x) return;
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += v[i];
    *out = s;
}

/* g[c] = sum_i a[i][c]: a bias gradient */
__global__ void k_colsum(const float *a, float *g, size_t n, size_t cols)
{
    TID(c, cols);
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i * cols + c];
    g[c] = s;
}

/* gw2[j][c] = sum_i h[i][j] * dz[i][c] */
__global__ void k_grad_w2(const float *h, const float *dz, float *gw2, size_t n, size_t H, size_t C)
{
    TID(t, H * C);
    size_t j = t / C, c = t % C;
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += h[i * H + j] * dz[i * C + c];
    gw2[t] = s;
}

/* dh[i][j] = (sum_c dz[i][c] * w2[j][c]) where the ReLU was open, else 0 */
__global__ void k_grad_h(const float *dz, const float *w2, const float *h, float *dh, size_t n, size_t H,
                         size_t C)
{
    TID(t, n * H);
    size_t i = t / H, j = t % H;
    float s = 0.0f;
    for (size_t c = 0; c < C; c++) s += dz[i * C + c] * w2[j * C + c];
    dh[t] = h[t] > 0.0f ? s : 0.0f;
}

/* gw1[d][j] = sum_i x[idx[i]][d] * dh[i][j] */
__global__ void k_grad_w1(const float *x, const uint64_t *idx, const float *dh, float *gw1, size_t n,
                          size_t D, size_t H)
{
    TID(t, D * H);
    size_t d = t / H, j = t % H;
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += x[idx[i] * D + d] * dh[i * H + j];
    gw1[t] = s;
}

__global__ void k_sgd(float *p, const float *g, float lr, size_t n)
{
    TID(t, n);
    p[t] -= lr * g[t];
}

/* splitmix64, as in examples/nn: the same numbers on every rank and platform */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_normal(uint64_t *s)
{
    double u = ((rng_next(s) >> 11) + 0.5) * 0x1.0p-53, v = ((rng_next(s) >> 11) + 0.5) * 0x1.0p-53;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586476925 * v);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: cuda_train [options]\n"
               "  --steps K        optimizer steps (default 50)\n"
               "  --batch B        global batch size (default 256)\n"
               "  --lr X           SGD learning rate (default 0.1)\n"
               "  --seed N         data, initialization and batch seed (default 1)\n"
               "  --samples N      synthetic samples (default 4096)\n"
               "  --features D     input features (default 64)\n"
               "  --hidden H       hidden units (default 128)\n"
               "  --classes C      classes, at least 2 (default 10)\n"
               "  --print-every K  print the batch loss every K steps, 0 for never (default 10)\n"
               "  --stream         run on a non-blocking stream of its own, named by dp_set_stream\n"
               "  --grad-ready     hand the last layer's gradients to dp_grad_ready during backward\n"
               "  --time           print the time per step of the steps after the first tenth\n"
               "  --save PATH      write the final parameters (format in the source's head comment)\n");
}

static int parse_u64(const char *s, unsigned long long max, unsigned long long *out)
{
    char *end;
    if (!s || *s < '0' || *s > '9') return -1;
    errno = 0;
    *out = strtoull(s, &end, 10);
    return *end || errno || *out > max ? -1 : 0;
}

static float *dalloc(size_t n)
{
    void *p;
    CK(cudaMalloc(&p, (n ? n : 1) * sizeof(float)));
    return (float *)p;
}

static void put_u32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

int main(int argc, char **argv)
{
    unsigned long long steps = 50, B = 256, seed = 1, N = 4096, D = 64, H = 128, C = 10, every = 10;
    double lr = 0.1;
    const char *save = NULL;
    int use_stream = 0, grad_ready = 0, timed = 0;
    const unsigned long long dim_max = 1ull << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, takes = 1;
        if (!strcmp(a, "--steps")) bad = parse_u64(v, UINT32_MAX, &steps);
        else if (!strcmp(a, "--batch")) bad = parse_u64(v, dim_max, &B) || B == 0;
        else if (!strcmp(a, "--seed")) bad = parse_u64(v, UINT64_MAX, &seed);
        else if (!strcmp(a, "--samples")) bad = parse_u64(v, dim_max, &N) || N == 0;
        else if (!strcmp(a, "--features")) bad = parse_u64(v, dim_max, &D) || D == 0;
        else if (!strcmp(a, "--hidden")) bad = parse_u64(v, dim_max, &H) || H == 0;
        else if (!strcmp(a, "--classes")) bad = parse_u64(v, dim_max, &C) || C < 2;
        else if (!strcmp(a, "--print-every")) bad = parse_u64(v, UINT32_MAX, &every);
        else if (!strcmp(a, "--save")) save = v, bad = !v;
        else if (!strcmp(a, "--lr")) {
            char *end = NULL;
            lr = v ? strtod(v, &end) : 0.0;
            bad = !v || *end || !(lr > 0.0 && lr < 1e6);
        } else {
            takes = 0;
            if (!strcmp(a, "--stream")) use_stream = 1;
            else if (!strcmp(a, "--grad-ready")) grad_ready = 1;
            else if (!strcmp(a, "--time")) timed = 1;
            else if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 0;
            else bad = 2;
        }
        if (bad) {
            fprintf(stderr, "cuda_train: %s %s\n", bad == 2 ? "unknown option" : "bad or missing value for",
                    a);
            usage(stderr);
            return 2;
        }
        i += takes;
    }

    int dev;
    CK(cudaGetDevice(&dev)); /* under dpshim with one GPU per rank, CUDA_VISIBLE_DEVICES makes it 0 */
    CK(cudaFree(0));         /* create the context now, so a missing GPU is reported here */
    cudaStream_t st = 0;     /* the legacy default stream, which the hooks wait on by default */
    if (use_stream) {
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        if (dp_set_stream) dp_set_stream(dev, (void *)st);
    }

    /* One seed, rank 0's, for everything drawn: data, initial weights, and the batch sequence. */
    uint64_t s = seed;
    if (dp_seed) dp_seed(&s);
    uint64_t data_rng = s ^ 0xda7a5eedull, init_rng = s, batch_rng = s ^ 0xba7c4ull;

    /* Synthetic data: Gaussian clusters around one random center per class. */
    float *hx = (float *)malloc(N * D * sizeof(float)), *center = (float *)malloc(C * D * sizeof(float));
    int32_t *hy = (int32_t *)malloc(N * sizeof(int32_t));
    size_t P = D * H + H + H * C + C; /* parameters, in the order of the --save file */
    float *hp = (float *)calloc(P, sizeof(float));
    uint64_t *idx = (uint64_t *)malloc((N > B ? N : B) * sizeof(uint64_t));
    if (!hx || !center || !hy || !hp || !idx) {
        fprintf(stderr, "cuda_train: out of host memory\n");
        return 1;
    }
    for (size_t k = 0; k < C * D; k++) center[k] = (float)(0.3 * rng_normal(&data_rng));
    for (size_t i = 0; i < N; i++) {
        hy[i] = (int32_t)(rng_next(&data_rng) % C);
        for (size_t d = 0; d < D; d++) hx[i * D + d] = center[hy[i] * D + d] + (float)rng_normal(&data_rng);
    }
    /* He initialization for the ReLU layer, plain 1/sqrt(fan-in) for the output; zero biases. */
    double sd1 = sqrt(2.0 / (double)D), sd2 = sqrt(1.0 / (double)H);
    for (size_t k = 0; k < D * H; k++) hp[k] = (float)(sd1 * rng_normal(&init_rng));
    for (size_t k = 0; k < H * C; k++) hp[D * H + H + k] = (float)(sd2 * rng_normal(&init_rng));

    size_t cap = N > B ? N : B; /* activation rows: a batch, or all samples for the final loss */
    float *x = dalloc(N * D), *h = dalloc(cap * H), *dh = dalloc(cap * H), *z = dalloc(cap * C),
          *dz = dalloc(cap * C);
    float *w1 = dalloc(D * H), *b1 = dalloc(H), *w2 = dalloc(H * C), *b2 = dalloc(C);
    float *gw1 = dalloc(D * H), *gb1 = dalloc(H), *gw2 = dalloc(H * C), *gb2 = dalloc(C);
    int32_t *y;
    uint64_t *didx;
    double *loss, *loss_sum;
    CK(cudaMalloc((void **)&y, N * sizeof(int32_t)));
    CK(cudaMalloc((void **)&didx, cap * sizeof(uint64_t)));
    CK(cudaMalloc((void **)&loss, cap * sizeof(double)));
    CK(cudaMalloc((void **)&loss_sum, sizeof(double)));
    /* Everything goes through `st`, so the hooks (ordered after `st` once it is named) see it. */
    CK(cudaMemcpyAsync(x, hx, N * D * sizeof(float), cudaMemcpyHostToDevice, st));
    CK(cudaMemcpyAsync(y, hy, N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    float *dp[4] = {w1, b1, w2, b2}, *dg[4] = {gw1, gb1, gw2, gb2};
    size_t cnt[4] = {D * H, H, H * C, C}, off = 0;
    for (int k = 0; k < 4; off += cnt[k], k++)
        CK(cudaMemcpyAsync(dp[k], hp + off, cnt[k] * sizeof(float), cudaMemcpyHostToDevice, st));
    CK(cudaStreamSynchronize(st));

    dp_tensor params[4] = {{w1, D * H, DP_F32, dev, "fc1.w"}, {b1, H, DP_F32, dev, "fc1.b"},
                           {w2, H * C, DP_F32, dev, "fc2.w"}, {b2, C, DP_F32, dev, "fc2.b"}};
    dp_tensor grads[4] = {{gw1, D * H, DP_F32, dev, "fc1.w"}, {gb1, H, DP_F32, dev, "fc1.b"},
                          {gw2, H * C, DP_F32, dev, "fc2.w"}, {gb2, C, DP_F32, dev, "fc2.b"}};
    if (dp_params) dp_params(params, 4);
    printf("cuda_train: %llu samples, model %llu-%llu-%llu, batch %llu, lr %g, %s stream%s\n", N, D, H, C, B,
           lr, use_stream ? "own" : "default", grad_ready ? ", dp_grad_ready" : "");

    /* --time: the clock runs from the end of the first tenth of the steps (warm-up: the first
     * launches load the kernels) to the end of the last, both read after the GPU finished. */
    unsigned long long warm = steps / 10 ? steps / 10 : steps > 1;
    struct timespec t0 = {0, 0}, t1;
    for (unsigned long long step = 1; step <= steps; step++) {
        if (timed && step == warm + 1) {
            CK(cudaStreamSynchronize(st));
            clock_gettime(CLOCK_MONOTONIC, &t0);
        }
        /* The global batch is drawn identically on every rank, before dp_batch keeps our share. */
        for (size_t i = 0; i < B; i++) idx[i] = rng_next(&batch_rng) % N;
        size_t n = dp_batch ? dp_batch(idx, B) : B;
        /* From pageable memory the copy returns once idx is staged, so idx can be redrawn. */
        if (n) CK(cudaMemcpyAsync(didx, idx, n * sizeof(uint64_t), cudaMemcpyHostToDevice, st));
        LAUNCH(k_hidden, n * H, st, x, didx, w1, b1, h, n, D, H);
        LAUNCH(k_logits, n * C, st, h, w2, b2, z, n, H, C);
        LAUNCH(k_softmax, n, st, z, y, didx, dz, loss, n, C);
        LAUNCH(k_sum, 1, st, loss, n, loss_sum);
        /* Backward; with an empty share the loops sum nothing and every gradient is 0. */
        LAUNCH(k_grad_w2, H * C, st, h, dz, gw2, n, H, C);
        LAUNCH(k_colsum, C, st, dz, gb2, n, C);
        if (grad_ready && dp_grad_ready) {
            dp_grad_ready(&grads[2]); /* final now; untouched until dp_grads returns */
            dp_grad_ready(&grads[3]);
        }
        LAUNCH(k_grad_h, n * H, st, dz, w2, h, dh, n, H, C);
        LAUNCH(k_grad_w1, D * H, st, x, didx, dh, gw1, n, D, H);
        LAUNCH(k_colsum, H, st, dh, gb1, n, H);
        if (dp_grads) dp_grads(grads, 4);
        for (int k = 0; k < 4; k++) LAUNCH(k_sgd, cnt[k], st, dp[k], dg[k], (float)lr, cnt[k]);
        if (dp_step_end) dp_step_end(step);
        if (every && (step % every == 0 || step == 1 || step == steps)) {
            /* The global batch's mean: summed losses and sample counts over the ranks. */
            double v[2] = {0.0, (double)n};
            CK(cudaMemcpyAsync(&v[0], loss_sum, sizeof(double), cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            if (dp_metric) dp_metric(v, 2, DP_SUM);
            printf("step %llu loss %.6f\n", step, v[1] > 0 ? v[0] / v[1] : 0.0);
            fflush(stdout);
        }
    }

    if (timed && steps > warm) {
        CK(cudaStreamSynchronize(st));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s_ = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("cuda_train: %llu steps timed (after %llu), %.4f ms per step\n", steps - warm, warm,
               1e3 * s_ / (double)(steps - warm));
    }

    /* Final loss over all N samples with the final parameters, identical on every rank. */
    for (size_t i = 0; i < N; i++) idx[i] = i;
    CK(cudaMemcpyAsync(didx, idx, N * sizeof(uint64_t), cudaMemcpyHostToDevice, st));
    LAUNCH(k_hidden, N * H, st, x, didx, w1, b1, h, (size_t)N, D, H);
    LAUNCH(k_logits, N * C, st, h, w2, b2, z, (size_t)N, H, C);
    LAUNCH(k_softmax, N, st, z, y, didx, dz, loss, (size_t)N, C);
    LAUNCH(k_sum, 1, st, loss, (size_t)N, loss_sum);
    double final_loss;
    CK(cudaMemcpyAsync(&final_loss, loss_sum, sizeof(double), cudaMemcpyDeviceToHost, st));
    off = 0;
    for (int k = 0; k < 4; off += cnt[k], k++)
        CK(cudaMemcpyAsync(hp + off, dp[k], cnt[k] * sizeof(float), cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    uint64_t fnv = 0xcbf29ce484222325ull;
    const unsigned char *bytes = (const unsigned char *)hp;
    for (size_t k = 0; k < P * sizeof(float); k++) fnv = (fnv ^ bytes[k]) * 0x100000001b3ull;
    printf("cuda_train: final loss %.6f checksum %016llx\n", final_loss / (double)N, (unsigned long long)fnv);

    int status = 0;
    /* Every rank holds the same parameters: rank 0 alone writes the file. */
    int scoped = save && dp_scope_begin && dp_scope_end;
    if (save && (!scoped || dp_scope_begin("cuda_train.save") == 1)) {
        unsigned char hdr[24] = {'C', 'U', 'D', 'A', 'T', 'R', 'N', '1'};
        put_u32(hdr + 8, (uint32_t)D), put_u32(hdr + 12, (uint32_t)H), put_u32(hdr + 16, (uint32_t)C);
        put_u32(hdr + 20, (uint32_t)steps);
        FILE *f = fopen(save, "wb");
        int ok = f && fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr && fwrite(hp, sizeof(float), P, f) == P;
        if (f && fclose(f) != 0) ok = 0;
        if (!ok) {
            fprintf(stderr, "cuda_train: cannot write %s: %s\n", save, strerror(errno));
            status = 1;
        }
    }
    if (scoped) dp_scope_end();
    if (use_stream) {
        if (dp_set_stream) dp_set_stream(dev, NULL); /* no hook may order work on a dead stream */
        CK(cudaStreamDestroy(st));
    }
    return status;
}
