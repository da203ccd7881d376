/* Functions with 0 to 8 arguments of mixed integer, float and pointer types, for the declarative
 * hooks' round-trip test (ffi_roundtrip.c): each result depends on every argument. */
#include <stddef.h>
#include <stdint.h>

int32_t ft_none(void)
{
    return 12345;
}
int32_t ft_1(int32_t a)
{
    return a * 3 + 1;
}
double ft_2(double a, int64_t b)
{
    return a * 0.5 + (double)b;
}
float ft_3(float a, const float *p, uint8_t c)
{
    return a + p[0] * p[1] - (float)c;
}
int64_t ft_4(int8_t a, uint16_t b, int32_t c, int64_t d)
{
    return (int64_t)a * 1000003 + b * 31 + c * 7 + d;
}
double ft_5(float a, double b, size_t c, const double *p, int32_t n)
{
    double s = a + b * (double)c;
    for (int32_t i = 0; i < n; i++)
        s += p[i] * (i + 1);
    return s;
}
void *ft_6(void *p, size_t off, int a, double b, float c)
{
    return (char *)p + off + (size_t)(a + (int)b + (int)c);
}
uint16_t ft_7(uint8_t a, int16_t b, uint32_t c, float d, double e, int64_t f, const int32_t *g)
{
    return (uint16_t)(a + b * 3 + c * 5 + (int)(d * 7) + (int)(e * 11) + f * 13 + g[0] * 17);
}
double ft_8(double a, float b, int32_t c, int64_t d, uint8_t e, const double *f, double g, float h)
{
    return a - b * 2 + c * 3.5 - (double)d / 7 + e + f[0] * f[1] + g * h;
}
void ft_out(double *out, int32_t a)
{
    *out = a * 1.25;
}

/* Called by libffi_late.so, which the test opens with dlopen. */
int32_t ft_late(int32_t x)
{
    return x * 2;
}
