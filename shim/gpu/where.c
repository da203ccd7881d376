/* Device pointers among DP_HOST tensors (see where.h). */
#define _GNU_SOURCE
#include "where.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* cuPointerGetAttribute(data, attribute, pointer) and the values cuda.h gives them */
typedef int (*pointer_attr_fn)(void *, int, unsigned long long);
enum {
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_MEMORYTYPE_DEVICE = 2
};

static _Atomic(pointer_attr_fn) attr_fn;
/* dl_iterate_phdr's count of objects loaded so far when the driver was last found missing */
static _Atomic unsigned long long looked_at_adds = ULLONG_MAX;

static int first_object(struct dl_phdr_info *info, size_t size, void *adds)
{
    *(unsigned long long *)adds = size >= offsetof(struct dl_phdr_info, dlpi_subs) ? info->dlpi_adds : 0;
    return 1; /* the count is the same in every entry: one is enough */
}

int dps_gpu_driver_loaded(void)
{
    if (atomic_load_explicit(&attr_fn, memory_order_acquire)) return 1;
    /* dlopen with RTLD_NOLOAD still searches the library path (about 12 us, at every hook call
     * on a machine without the driver): look again only when an object was loaded since */
    unsigned long long adds = 0;
    dl_iterate_phdr(first_object, &adds);
    if (adds && adds == atomic_load_explicit(&looked_at_adds, memory_order_relaxed)) return 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        atomic_store_explicit(&looked_at_adds, adds, memory_order_relaxed);
        return 0;
    }
    pointer_attr_fn f;
    *(void **)&f = dlsym(h, "cuPointerGetAttribute");
    dlclose(h); /* only drops the reference NOLOAD took: the program keeps the driver loaded */
    if (!f) return 0;
    atomic_store_explicit(&attr_fn, f, memory_order_release);
    return 1;
}

int dps_gpu_where(const void *p)
{
    pointer_attr_fn f = atomic_load_explicit(&attr_fn, memory_order_acquire);
    unsigned int type = 0;
    int dev = -1;
    /* an error (host memory the driver never saw, or a driver not yet initialized) means host */
    if (!f || !p || f(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (unsigned long long)(uintptr_t)p) != 0 ||
        type != CU_MEMORYTYPE_DEVICE)
        return -1;
    return f(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (unsigned long long)(uintptr_t)p) == 0 ? dev : -1;
}
