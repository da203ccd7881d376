/* Declarative hooks, round trip: every ft_* function of libffi_targets.so is declared in
 * policies/ffi_roundtrip.conf (no actions but for ft_late). Calls through the program's GOT go
 * through dpshim's libffi closures; calls through a pointer from dlsym go straight to the
 * function. Both must give the same results, from one thread and from four at once. Then
 * libffi_late.so, opened with dlopen, must have its call to ft_late bound too, and two libraries
 * opened RTLD_LOCAL that each define ft_dup must each still reach their own.
 *   ffi_roundtrip [LATE_LIB [DUP_A_LIB DUP_B_LIB]] */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

int32_t ft_none(void);
int32_t ft_1(int32_t a);
double ft_2(double a, int64_t b);
float ft_3(float a, const float *p, uint8_t c);
int64_t ft_4(int8_t a, uint16_t b, int32_t c, int64_t d);
double ft_5(float a, double b, size_t c, const double *p, int32_t n);
void *ft_6(void *p, size_t off, int a, double b, float c);
uint16_t ft_7(uint8_t a, int16_t b, uint32_t c, float d, double e, int64_t f, const int32_t *g);
double ft_8(double a, float b, int32_t c, int64_t d, uint8_t e, const double *f, double g, float h);
void ft_out(double *out, int32_t a);

static int checks, failures;
#define SAME(a, b, what)                                                                                     \
    do {                                                                                                     \
        __typeof__(a) x_ = (a), y_ = (b);                                                                    \
        checks++;                                                                                            \
        if (memcmp(&x_, &y_, sizeof x_)) failures++, fprintf(stderr, "differs: %s\n", what);                 \
    } while (0)

#define DIRECT(name) ((__typeof__(&name))dlsym(RTLD_DEFAULT, #name))

static int round_trip(int k)
{
    int before = failures;
    float fp[2] = {1.5f + k, -2.25f};
    double dp[3] = {0.5, 1.0 / 3, -7.0 + k};
    int32_t ip[1] = {9 + k};
    char buf[64];
    SAME(ft_none(), DIRECT(ft_none)(), "0 arguments");
    SAME(ft_1(-7 + k), DIRECT(ft_1)(-7 + k), "1 argument");
    SAME(ft_2(3.25 + k, -(1ll << 40)), DIRECT(ft_2)(3.25 + k, -(1ll << 40)), "2 arguments");
    SAME(ft_3(0.1f * k, fp, 200), DIRECT(ft_3)(0.1f * k, fp, 200), "3 arguments");
    SAME(ft_4(-100, 65000, -123456 + k, 1ll << 50), DIRECT(ft_4)(-100, 65000, -123456 + k, 1ll << 50),
         "4 arguments");
    SAME(ft_5(1e-3f, 2.5, 1u << 31, dp, 3), DIRECT(ft_5)(1e-3f, 2.5, 1u << 31, dp, 3), "5 arguments");
    SAME(ft_6(buf, 3, k % 5, 2.9, 1.1f), DIRECT(ft_6)(buf, 3, k % 5, 2.9, 1.1f),
         "5 arguments, pointer result");
    SAME(ft_7(250, -300, 70000u + k, 1.5f, 2.25, -5, ip),
         DIRECT(ft_7)(250, -300, 70000u + k, 1.5f, 2.25, -5, ip), "7 arguments");
    SAME(ft_8(1.0 / 7, 3.5f, -2 + k, 1ll << 33, 255, dp, -0.125, 8.5f),
         DIRECT(ft_8)(1.0 / 7, 3.5f, -2 + k, 1ll << 33, 255, dp, -0.125, 8.5f), "8 arguments");
    double o1 = 0, o2 = 1;
    ft_out(&o1, 4 + k);
    DIRECT(ft_out)(&o2, 4 + k);
    SAME(o1, o2, "void result through a pointer");
    return failures - before;
}

static void *worker(void *arg)
{
    long bad = 0;
    for (int i = 0; i < 20000; i++) {
        double dp[3] = {0.5, 1.0 / 3, (double)i};
        bad += ft_8(1.0 / 7, 3.5f, i, (long)arg, 255, dp, -0.125, 8.5f) !=
               DIRECT(ft_8)(1.0 / 7, 3.5f, i, (long)arg, 255, dp, -0.125, 8.5f);
    }
    return (void *)bad;
}

int main(int argc, char **argv)
{
    for (int k = 0; k < 4; k++)
        round_trip(k);
    pthread_t t[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < 4; i++) {
        void *bad;
        pthread_join(t[i], &bad);
        checks++;
        if (bad) failures++, fprintf(stderr, "thread %d: %ld calls differ\n", i, (long)bad);
    }
    printf("round trip: %d checks, %d failed\n", checks, failures);
    if (argc > 1) {
        void *h = dlopen(argv[1], RTLD_NOW);
        int32_t (*late)(int32_t) = h ? (int32_t(*)(int32_t))dlsym(h, "late_call") : NULL;
        if (!late) {
            fprintf(stderr, "cannot open %s: %s\n", argv[1], dlerror());
            return 1;
        }
        printf("late_call(20) = %d\n", late(20));
    }
    if (argc > 3) {
        void *a = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL), *b = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL);
        int32_t (*ca)(int32_t) = a ? (int32_t(*)(int32_t))dlsym(a, "dup_call") : NULL;
        int32_t (*cb)(int32_t) = b ? (int32_t(*)(int32_t))dlsym(b, "dup_call") : NULL;
        if (!ca || !cb) {
            fprintf(stderr, "cannot open the ft_dup libraries: %s\n", dlerror());
            return 1;
        }
        printf("dup_call a(1) = %d, b(1) = %d\n", ca(1), cb(1));
    }
    return failures ? 1 : 0;
}
