/* The double's memory: "device" memory the host cannot touch (one memfd mapped twice, PROT_NONE
 * for the caller, read-write inside the double), pinned host memory, the table that tells them
 * apart, and the copies and memsets that move data through the read-write views. */
#define _GNU_SOURCE
#include "double.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* One allocation. size is what was asked for: ranges are checked against it, not the pages. */
typedef struct mem_entry {
    uintptr_t base;
    size_t size, map_len;
    char *rw; /* device memory: the double's view; pinned host memory: NULL (base is usable) */
    int kind, dev;
} mem_entry_t;

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static mem_entry_t *mem; /* sorted by base */
static size_t nmem, capmem;

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* Index of the entry whose range holds p, or nmem. Under mem_lock. */
static size_t find_locked(uintptr_t p)
{
    size_t lo = 0, hi = nmem;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (mem[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && p - mem[lo - 1].base < mem[lo - 1].size ? lo - 1 : nmem;
}

static int insert(const mem_entry_t *e)
{
    pthread_mutex_lock(&mem_lock);
    if (nmem == capmem) {
        size_t cap = capmem ? 2 * capmem : 64;
        mem_entry_t *grown = realloc(mem, cap * sizeof *mem);
        if (!grown) {
            pthread_mutex_unlock(&mem_lock);
            return DPS_DBL_ENOMEM;
        }
        mem = grown, capmem = cap;
    }
    size_t at = 0;
    while (at < nmem && mem[at].base < e->base)
        at++;
    memmove(mem + at + 1, mem + at, (nmem - at) * sizeof *mem);
    mem[at] = *e;
    nmem++;
    pthread_mutex_unlock(&mem_lock);
    return DPS_DBL_SUCCESS;
}

/* Removes the allocation starting exactly at p, of the given kind: 0, or cudaErrorInvalidValue. */
static int take(const void *p, int kind, mem_entry_t *out)
{
    pthread_mutex_lock(&mem_lock);
    size_t i = find_locked((uintptr_t)p);
    int ok = i < nmem && mem[i].base == (uintptr_t)p && mem[i].kind == kind;
    if (ok) {
        *out = mem[i];
        memmove(mem + i, mem + i + 1, (nmem - i - 1) * sizeof *mem);
        nmem--;
    }
    pthread_mutex_unlock(&mem_lock);
    return ok ? DPS_DBL_SUCCESS : DPS_DBL_EINVAL;
}

int dps_dbl_lookup(const void *p, size_t bytes, void **rw_p, int *dev_p)
{
    uintptr_t a = (uintptr_t)p;
    int kind = DPS_DBL_MEM_NONE;
    pthread_mutex_lock(&mem_lock);
    size_t i = find_locked(a);
    if (i < nmem && bytes <= mem[i].size - (a - mem[i].base)) {
        kind = mem[i].kind;
        if (rw_p) *rw_p = kind == DPS_DBL_MEM_DEVICE ? mem[i].rw + (a - mem[i].base) : (void *)p;
        if (dev_p) *dev_p = mem[i].dev;
    }
    pthread_mutex_unlock(&mem_lock);
    return kind;
}

DPS_DBL_API int cudaMalloc(void **p, size_t n)
{
    dps_dbl_trace("cudaMalloc bytes=%zu", n);
    mem_entry_t e = {0, n, page_round(n), NULL, DPS_DBL_MEM_DEVICE, 0};
    int err = dps_dbl_rt_begin();
    if (!err && !p) err = DPS_DBL_EINVAL;
    if (!err) err = dps_dbl_current_device(&e.dev);
    if (err || !n) {
        if (p && !err) *p = NULL; /* CUDA: a zero-byte allocation succeeds with NULL */
        return dps_dbl_rt_end(err);
    }
    /* The same pages twice: the caller's view faults on any host access, as on a GPU. */
    int fd = memfd_create("dpshim-double", MFD_CLOEXEC);
    void *none = MAP_FAILED, *rw = MAP_FAILED;
    if (fd >= 0 && !ftruncate(fd, (off_t)e.map_len)) {
        none = mmap(NULL, e.map_len, PROT_NONE, MAP_SHARED, fd, 0);
        rw = mmap(NULL, e.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (fd >= 0) close(fd);
    e.base = (uintptr_t)none, e.rw = rw;
    if (none == MAP_FAILED || rw == MAP_FAILED || insert(&e)) {
        if (none != MAP_FAILED) munmap(none, e.map_len);
        if (rw != MAP_FAILED) munmap(rw, e.map_len);
        return dps_dbl_rt_end(DPS_DBL_ENOMEM);
    }
    *p = none;
    dps_dbl_trace("cudaMalloc -> %p", none);
    return DPS_DBL_SUCCESS;
}

DPS_DBL_API int cudaFree(void *p)
{
    dps_dbl_trace("cudaFree ptr=%p", p);
    int err = dps_dbl_rt_begin();
    if (err || !p) return dps_dbl_rt_end(err);
    /* cudaFree synchronizes the device: work still queued may use the memory. */
    dps_dbl_drain_all();
    mem_entry_t e;
    err = take(p, DPS_DBL_MEM_DEVICE, &e);
    if (!err) {
        munmap((void *)e.base, e.map_len);
        munmap(e.rw, e.map_len);
    }
    return dps_dbl_rt_end(err);
}

DPS_DBL_API int cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    dps_dbl_trace("cudaHostAlloc bytes=%zu flags=%u", n, flags);
    mem_entry_t e = {0, n, page_round(n), NULL, DPS_DBL_MEM_HOST, 0};
    int err = dps_dbl_rt_begin();
    if (!err && !p) err = DPS_DBL_EINVAL;
    if (!err) err = dps_dbl_current_device(&e.dev);
    if (err || !n) {
        if (p && !err) *p = NULL;
        return dps_dbl_rt_end(err);
    }
    void *host = mmap(NULL, e.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    e.base = (uintptr_t)host;
    if (host == MAP_FAILED || insert(&e)) {
        if (host != MAP_FAILED) munmap(host, e.map_len);
        return dps_dbl_rt_end(DPS_DBL_ENOMEM);
    }
    *p = host;
    return DPS_DBL_SUCCESS;
}

DPS_DBL_API int cudaMallocHost(void **p, size_t n)
{
    return cudaHostAlloc(p, n, 0);
}

DPS_DBL_API int cudaFreeHost(void *p)
{
    dps_dbl_trace("cudaFreeHost ptr=%p", p);
    int err = dps_dbl_rt_begin();
    if (err || !p) return dps_dbl_rt_end(err);
    dps_dbl_drain_all();
    mem_entry_t e;
    err = take(p, DPS_DBL_MEM_HOST, &e);
    if (!err) munmap((void *)e.base, e.map_len);
    return dps_dbl_rt_end(err);
}

/* ---- copies and memsets ---- */

enum { H2H = 0, H2D = 1, D2H = 2, D2D = 3, DEFAULT_KIND = 4 };

static void run_copy(dps_dbl_work_t *w)
{
    memmove(w->dst, w->src, w->bytes);
}
static void run_set(dps_dbl_work_t *w)
{
    memset(w->dst, w->value, w->bytes);
}

/* One side of a copy: where the worker reads or writes it. A side the kind calls "device"
 * must lie inside one device allocation; a "host" side must not point into device memory.
 * A mismatch is a caller's bug that CUDA would turn into wrong data or a fault: refuse it. */
static int copy_side(const void *p, size_t n, int want_device, void **at_p)
{
    void *rw;
    int kind = dps_dbl_lookup(p, n, &rw, NULL);
    if (want_device) {
        if (kind != DPS_DBL_MEM_DEVICE) return DPS_DBL_EINVAL;
        *at_p = rw;
        return DPS_DBL_SUCCESS;
    }
    if (dps_dbl_lookup(p, 0, NULL, NULL) == DPS_DBL_MEM_DEVICE) return DPS_DBL_EINVAL;
    *at_p = (void *)p;
    return DPS_DBL_SUCCESS;
}

/* sync: cudaMemcpy (not Async). Which copies return only once done follows CUDA's "API
 * synchronization behavior": host to host always; cudaMemcpy unless device to device. A copy
 * between device and pageable memory may be synchronous in CUDA; the double never makes it so,
 * so a program that relies on it shows stale data here. */
static int copy(void *dst, const void *src, size_t n, int kind, void *stream, int sync)
{
    if (kind < H2H || kind > DEFAULT_KIND) return DPS_DBL_EDIRECTION;
    if (!n) return DPS_DBL_SUCCESS;
    int dst_dev, src_dev;
    if (kind == DEFAULT_KIND) {
        dst_dev = dps_dbl_lookup(dst, 0, NULL, NULL) == DPS_DBL_MEM_DEVICE;
        src_dev = dps_dbl_lookup(src, 0, NULL, NULL) == DPS_DBL_MEM_DEVICE;
    } else {
        dst_dev = kind == H2D || kind == D2D;
        src_dev = kind == D2H || kind == D2D;
    }
    dps_dbl_work_t w = {.run = run_copy, .delayed = 1, .bytes = n};
    void *s;
    int err = copy_side(dst, n, dst_dev, &w.dst);
    if (!err) err = copy_side(src, n, src_dev, &s);
    if (err) return err;
    w.src = s;
    int wait = (!dst_dev && !src_dev) || (sync && !(dst_dev && src_dev));
    return dps_dbl_enqueue(stream, &w, wait, NULL);
}

DPS_DBL_API int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream)
{
    dps_dbl_trace("cudaMemcpyAsync dst=%p src=%p bytes=%zu kind=%d stream=%p", dst, src, n, kind, stream);
    int err = dps_dbl_rt_begin();
    return dps_dbl_rt_end(err ? err : copy(dst, src, n, kind, stream, 0));
}

DPS_DBL_API int cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    dps_dbl_trace("cudaMemcpy dst=%p src=%p bytes=%zu kind=%d", dst, src, n, kind);
    int err = dps_dbl_rt_begin();
    return dps_dbl_rt_end(err ? err : copy(dst, src, n, kind, NULL, 1));
}

/* A memset writes device memory or pinned host memory (CUDA reaches that through UVA); it is
 * asynchronous except cudaMemset on pinned host memory. */
static int set(void *p, int value, size_t n, void *stream, int sync)
{
    if (!n) return DPS_DBL_SUCCESS;
    dps_dbl_work_t w = {.run = run_set, .delayed = 1, .bytes = n, .value = value & 0xff};
    int kind = dps_dbl_lookup(p, n, &w.dst, NULL);
    if (kind == DPS_DBL_MEM_NONE) return DPS_DBL_EINVAL;
    return dps_dbl_enqueue(stream, &w, sync && kind == DPS_DBL_MEM_HOST, NULL);
}

DPS_DBL_API int cudaMemsetAsync(void *p, int value, size_t n, void *stream)
{
    dps_dbl_trace("cudaMemsetAsync ptr=%p value=%d bytes=%zu stream=%p", p, value, n, stream);
    int err = dps_dbl_rt_begin();
    return dps_dbl_rt_end(err ? err : set(p, value, n, stream, 0));
}

DPS_DBL_API int cudaMemset(void *p, int value, size_t n)
{
    dps_dbl_trace("cudaMemset ptr=%p value=%d bytes=%zu", p, value, n);
    int err = dps_dbl_rt_begin();
    return dps_dbl_rt_end(err ? err : set(p, value, n, NULL, 1));
}

/* ---- driver API: what a pointer is ---- */

enum { ATTR_MEMORY_TYPE = 2, ATTR_DEVICE_ORDINAL = 9 };
enum { CU_INVALID_VALUE = 1, CU_DEVICE_INVALID = -2 };

DPS_DBL_API int cuPointerGetAttribute(void *data, int attr, unsigned long long ptr)
{
    dps_dbl_trace("cuPointerGetAttribute attr=%d ptr=0x%llx", attr, ptr);
    int err = dps_dbl_driver_begin();
    if (err) return err;
    int dev = 0;
    int kind = dps_dbl_lookup((const void *)(uintptr_t)ptr, 0, NULL, &dev);
    if (!data || kind == DPS_DBL_MEM_NONE) return CU_INVALID_VALUE;
    if (attr == ATTR_MEMORY_TYPE)
        *(unsigned *)data = (unsigned)kind;
    else if (attr == ATTR_DEVICE_ORDINAL)
        *(int *)data = dev;
    else
        return CU_INVALID_VALUE; /* not modelled */
    return 0;
}

/* Unlike cuPointerGetAttribute, an unknown pointer is no error: memory type 0, no device. */
DPS_DBL_API int cuPointerGetAttributes(unsigned n, int *attrs, void **data, unsigned long long ptr)
{
    dps_dbl_trace("cuPointerGetAttributes n=%u ptr=0x%llx", n, ptr);
    int err = dps_dbl_driver_begin();
    if (err) return err;
    if (!attrs || !data) return CU_INVALID_VALUE;
    int dev = CU_DEVICE_INVALID;
    int kind = dps_dbl_lookup((const void *)(uintptr_t)ptr, 0, NULL, &dev);
    for (unsigned i = 0; i < n; i++)
        if (attrs[i] != ATTR_MEMORY_TYPE && attrs[i] != ATTR_DEVICE_ORDINAL) return CU_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        if (!data[i]) continue;
        if (attrs[i] == ATTR_MEMORY_TYPE)
            *(unsigned *)data[i] = (unsigned)kind;
        else
            *(int *)data[i] = kind == DPS_DBL_MEM_NONE ? CU_DEVICE_INVALID : dev;
    }
    return 0;
}
