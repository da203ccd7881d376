/* What the engine's host path (fusion.c, progress.c) and GPU path (device.c) both use, below
 * both (common.c): the engine's state, the check of a framework's tensors, and the list of
 * gradients that dp_grad_ready announced and dp_grads then completes. */
#ifndef DPS_ENGINE_COMMON_H
#define DPS_ENGINE_COMMON_H

#include <stddef.h>

#include "engine.h"

/* A framework's bad tensor (no data, invalid dtype; on a GPU where device_ok is 0), named before
 * any collective starts: 0, or -1 after logging. */
int dps_check_tensors(const char *hook, const dp_tensor *t, size_t n, int device_ok);

/* Gradients announced by dp_grad_ready in this step: pending (not yet handed to a collective)
 * and handed on (reduced, queued or submitted); and the list dp_grads completes them into. One
 * per path (host, GPU), owned by the main thread. */
typedef struct dps_ready {
    dp_tensor *pending;
    size_t npending, cap_pending, pending_bytes;
    const void **handed; /* the data of each tensor handed on */
    size_t nhanded, cap_handed;
    dp_tensor *rest; /* dp_grads: the pending ones, then the call's tensors not announced */
    size_t cap_rest;
} dps_ready_t;

/* Adds t (bytes as it will travel) to the pending ones: 0, or -1 when memory runs out. */
int dps_ready_add(dps_ready_t *r, const dp_tensor *t, size_t bytes);
/* Room to note every pending tensor as handed on, made before it is: 0, or -1. */
int dps_ready_reserve(dps_ready_t *r);
/* The pending tensors were handed on (after dps_ready_reserve): noted, and none is pending. */
void dps_ready_handed_on(dps_ready_t *r);
/* Whether the tensor with this data was announced in this step. */
int dps_ready_announced(const dps_ready_t *r, const void *data);
/* Room in r->rest for the pending tensors and n more: 0, or -1 when memory runs out. */
int dps_ready_make_room(dps_ready_t *r, size_t n);
/* dp_grads's tensors t[0..n): the pending ones, then those of t not announced, into r->rest; the
 * step's list starts afresh. Their number into *m_p: 0, or -1 when memory runs out (never after
 * dps_ready_make_room for n). */
int dps_ready_complete(dps_ready_t *r, const dp_tensor *t, size_t n, size_t *m_p);
/* Announced and not yet completed by dp_grads. */
static inline int dps_ready_outstanding(const dps_ready_t *r)
{
    return r->npending + r->nhanded > 0;
}

#endif
