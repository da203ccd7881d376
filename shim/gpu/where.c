/* Device pointers among DP_HOST tensors (see where.h). */
#define _GNU_SOURCE
#include "where.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>

/* cuPointerGetAttribute(data, attribute, pointer) and the values cuda.h gives them */
typedef int (*pointer_attr_fn)(void *, int, unsigned long long);
enum { CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9, CU_MEMORYTYPE_DEVICE = 2 };

static _Atomic(pointer_attr_fn) attr_fn;

int dps_gpu_driver_loaded(void)
{
    if (atomic_load_explicit(&attr_fn, memory_order_acquire)) return 1;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return 0;
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
