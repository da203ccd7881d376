/* f32_diff A B: two files of raw float32 values (legacy_train's models); prints
 * "rel R" = max|a-b| / max|a|, or "bitwise" when they are identical. Exit 1 when the files
 * cannot be read or differ in length. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static float *load(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1024, k = 0;
    float *v = malloc(cap * sizeof *v);
    for (size_t got; v && (got = fread(v + k, sizeof *v, cap - k, f)) > 0;) {
        k += got;
        if (k == cap) v = realloc(v, (cap *= 2) * sizeof *v);
    }
    fclose(f);
    *n = k;
    return v;
}

int main(int argc, char **argv)
{
    size_t na = 0, nb = 0;
    float *a = argc == 3 ? load(argv[1], &na) : NULL, *b = argc == 3 ? load(argv[2], &nb) : NULL;
    if (!a || !b || na != nb || !na) {
        fprintf(stderr, "usage: f32_diff A B (two raw float32 files of one length)\n");
        return 1;
    }
    double diff = 0, mag = 0;
    int same = 1;
    for (size_t i = 0; i < na; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        mag = fmax(mag, fabs((double)a[i]));
        same &= a[i] == b[i];
    }
    if (same)
        printf("bitwise\n");
    else
        printf("rel %.3e\n", mag > 0 ? diff / mag : diff);
    return 0;
}
