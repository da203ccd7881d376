/* GOT binding: points every loaded object's GOT slots for a set of symbols (PLT jump slots and
 * GLOB_DAT function pointers) wherever a client says, now and in objects dlopen loads later.
 * It knows nothing of what the new targets do (ffihooks.c: libffi closures for [hook] sections). */
#ifndef DPS_GOT_H
#define DPS_GOT_H

#include <stddef.h>

/* What a binding pass asks its client; every callback runs under the binder's lock, one pass at
 * a time, possibly from a thread that has just called dlopen. */
typedef struct dps_got_client {
    const char *const *names; /* the symbols whose slots are bound */
    int nnames;
    const void *skip; /* the load address of one more object never patched (NULL: none) */
    void *ctx;
    /* At the start of each pass: objects may have arrived since the last. May be NULL. */
    void (*pass_begins)(void *ctx);
    /* What an object's slot for names[i] should hold, given `def`, the definition ld.so binds
     * that object's references to (its global scope first, then its own dependencies); NULL
     * leaves the slot as it is. */
    void *(*target)(void *ctx, int i, void *def);
    /* A slot for names[i] that held something else now holds its target. */
    void (*patched)(void *ctx, int i);
} dps_got_client_t;

/* Once, in the constructor: binds every loaded object but libdpshim.so and c->skip, and points
 * their dlopen slots at a wrapper that binds what each dlopen loaded once the outermost dlopen
 * of a thread returns. `c` must outlive the job. 0, or -1 with err set (out of memory). */
int dps_got_start(const dps_got_client_t *c, char *err, size_t len);

#endif
