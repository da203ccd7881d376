/* IDX files (the MNIST family's format), gzipped or plain, read with zlib. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "dpnn.h"

#define IDX_U8_1D 0x00000801u
#define IDX_U8_3D 0x00000803u

static int gz_read_all(gzFile f, void *buf, size_t len)
{
    for (size_t got = 0; got < len;) {
        unsigned chunk = len - got > (1u << 30) ? (1u << 30) : (unsigned)(len - got);
        int r = gzread(f, (char *)buf + got, chunk);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static uint32_t be32(const unsigned char *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Reads an IDX file of unsigned bytes with `ndim` dimensions into *data_p. */
static int read_idx(const char *path, uint32_t magic, int ndim, uint32_t *dims, uint8_t **data_p, char *err,
                    size_t errlen)
{
    gzFile f = gzopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno ? errno : ENOENT));
        return -1;
    }
    unsigned char hdr[16];
    size_t hlen = 4 + 4 * (size_t)ndim, total = 1;
    if (gz_read_all(f, hdr, hlen) != 0 || be32(hdr) != magic) {
        snprintf(err, errlen, "%s is not an IDX file of %d-dimensional bytes (bad or truncated header)", path,
                 ndim);
        gzclose(f);
        return -1;
    }
    for (int i = 0; i < ndim; i++) {
        dims[i] = be32(hdr + 4 + 4 * i);
        total *= dims[i];
    }
    if (total == 0 || total > ((size_t)1 << 34)) {
        snprintf(err, errlen, "%s: implausible dimensions", path);
        gzclose(f);
        return -1;
    }
    uint8_t *data = malloc(total);
    if (!data || gz_read_all(f, data, total) != 0) {
        snprintf(err, errlen, "%s: %s", path,
                 data ? "truncated: fewer bytes than its header says" : "out of memory");
        free(data);
        gzclose(f);
        return -1;
    }
    gzclose(f);
    *data_p = data;
    return 0;
}

int dpnn_data_load(const char *images, const char *labels, dpnn_data_t *out, char *err, size_t errlen)
{
    uint32_t idim[3], ldim[1];
    memset(out, 0, sizeof *out);
    if (read_idx(images, IDX_U8_3D, 3, idim, &out->pixels, err, errlen) != 0) return -1;
    if (read_idx(labels, IDX_U8_1D, 1, ldim, &out->labels, err, errlen) != 0) {
        dpnn_data_free(out);
        return -1;
    }
    if (idim[0] != ldim[0]) {
        snprintf(err, errlen, "%s has %u images but %s has %u labels", images, idim[0], labels, ldim[0]);
        dpnn_data_free(out);
        return -1;
    }
    out->n = idim[0];
    out->dim = (size_t)idim[1] * idim[2];
    return 0;
}

void dpnn_data_free(dpnn_data_t *d)
{
    free(d->pixels);
    free(d->labels);
    memset(d, 0, sizeof *d);
}
