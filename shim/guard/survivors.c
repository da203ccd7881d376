/* The survivors' agreement (survivors.h): views of the lost ranks, the coordinator's decision. */
#include "survivors.h"

#include <stdlib.h>
#include <string.h>

typedef struct outgoing {
    int dest;
    dps_surv_msg_t m;
} outgoing_t;

typedef struct peer_view {
    uint64_t hash, done;
    uint64_t seq; /* of the last view read from it */
    unsigned char have, ready;
} peer_view_t;

struct dps_survivors {
    int size, self, nlost;
    uint8_t *lost;     /* this rank's view */
    peer_view_t *peer; /* what each rank last said (the coordinator reads these) */
    int ready;
    uint64_t done;
    int broken;
    /* the adopted decision, with its bitmaps */
    dps_surv_decision_t decision;
    uint8_t *decided_lost, *decided_laggard;
    outgoing_t *out;
    size_t nout, cap_out, head_out;
    uint64_t sent; /* messages queued so far: the next one's sequence number less one */
};

/* A bitmap of the job's ranks: never more than a message holds (dps_surv_new refuses larger
 * jobs; the bound, said here, keeps the compiler's bounds checks quiet too). */
static size_t bitmap_bytes(int size)
{
    size_t n = ((size_t)size + 7) / 8;
    return n < DPS_SURV_MAX_RANKS / 8 ? n : DPS_SURV_MAX_RANKS / 8;
}

static int bit(const uint8_t *b, int r)
{
    return b[r / 8] >> (r % 8) & 1;
}

static void set_bit(uint8_t *b, int r)
{
    b[r / 8] |= (uint8_t)(1u << (r % 8));
}

/* FNV-1a over the bitmap: views are compared by it */
static uint64_t hash_of(const uint8_t *b, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

dps_survivors_t *dps_surv_new(int size, int self)
{
    if (size < 1 || size > DPS_SURV_MAX_RANKS || self < 0 || self >= size) return NULL;
    dps_survivors_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->size = size, s->self = self;
    size_t n = bitmap_bytes(size);
    s->lost = calloc(1, n), s->decided_lost = calloc(1, n), s->decided_laggard = calloc(1, n);
    s->peer = calloc((size_t)size, sizeof *s->peer);
    if (!s->lost || !s->decided_lost || !s->decided_laggard || !s->peer) {
        dps_surv_free(s);
        return NULL;
    }
    s->decision.is_lost = s->decided_lost, s->decision.laggard = s->decided_laggard;
    return s;
}

void dps_surv_free(dps_survivors_t *s)
{
    if (!s) return;
    free(s->lost), free(s->decided_lost), free(s->decided_laggard), free(s->peer), free(s->out);
    free(s);
}

static int coordinator(const dps_survivors_t *s)
{
    for (int r = 0; r < s->size; r++)
        if (!bit(s->lost, r)) return r;
    return -1;
}

static void queue(dps_survivors_t *s, int dest, const dps_surv_msg_t *m)
{
    if (s->nout == s->cap_out) {
        if (s->head_out) { /* room at the front first */
            memmove(s->out, s->out + s->head_out, (s->nout - s->head_out) * sizeof *s->out);
            s->nout -= s->head_out, s->head_out = 0;
        }
        if (s->nout == s->cap_out) {
            size_t cap = s->cap_out ? 2 * s->cap_out : 16;
            outgoing_t *o = realloc(s->out, cap * sizeof *o);
            if (!o) return; /* a message lost to memory: the coordinator waits, the guard's timeout ends it */
            s->out = o, s->cap_out = cap;
        }
    }
    s->out[s->nout].dest = dest, s->out[s->nout].m = *m;
    s->out[s->nout].m.seq = ++s->sent;
    s->nout++;
}

static dps_surv_msg_t view_msg(const dps_survivors_t *s)
{
    dps_surv_msg_t m = {.kind = DPS_SURV_VIEW,
                        .lost = (uint32_t)s->nlost,
                        .ready = (uint32_t)s->ready,
                        .root = -1,
                        .done = s->done};
    memcpy(m.bits, s->lost, bitmap_bytes(s->size));
    m.view_hash = hash_of(s->lost, bitmap_bytes(s->size));
    return m;
}

/* The coordinator's own view counts as told; a view of everyone alive, the same and ready, decides. */
static void try_decide(dps_survivors_t *s)
{
    if (coordinator(s) != s->self || !s->ready || s->broken) return;
    if (s->decision.lost == (uint32_t)s->nlost && s->nlost) return; /* decided on this view already */
    uint64_t h = hash_of(s->lost, bitmap_bytes(s->size)), cut = 0, low = UINT64_MAX;
    for (int r = 0; r < s->size; r++) {
        if (bit(s->lost, r)) continue;
        const peer_view_t *p = &s->peer[r];
        uint64_t done = r == s->self ? s->done : p->done;
        if (r != s->self && !(p->have && p->ready && p->hash == h)) return;
        if (done > cut) cut = done;
        if (done < low) low = done;
    }
    if (cut - low > 1) {
        s->broken = 1;
        return;
    }
    dps_surv_msg_t m = {
        .kind = DPS_SURV_DECIDE, .lost = (uint32_t)s->nlost, .done = cut, .root = -1, .view_hash = h};
    size_t n = bitmap_bytes(s->size);
    memcpy(m.bits, s->lost, n);
    for (int r = 0; r < s->size; r++) {
        if (bit(s->lost, r)) continue;
        uint64_t done = r == s->self ? s->done : s->peer[r].done;
        if (done == cut && m.root < 0) m.root = r;
        if (done < cut) set_bit(m.bits + n, r);
    }
    for (int r = 0; r < s->size; r++)
        if (r != s->self && !bit(s->lost, r)) queue(s, r, &m);
    dps_surv_receive(s, s->self, &m); /* adopted here as anywhere */
}

/* This rank's view grew: the coordinator (perhaps a new one) hears it. */
static void view_changed(dps_survivors_t *s)
{
    int c = coordinator(s);
    if (c < 0) return;
    if (c == s->self) {
        try_decide(s);
        return;
    }
    dps_surv_msg_t m = view_msg(s);
    queue(s, c, &m);
}

static int merge(dps_survivors_t *s, const uint8_t *b)
{
    int grew = 0;
    for (int r = 0; r < s->size; r++)
        if (bit(b, r) && !bit(s->lost, r)) set_bit(s->lost, r), s->nlost++, grew = 1;
    return grew;
}

int dps_surv_lost(dps_survivors_t *s, int r)
{
    if (r < 0 || r >= s->size || r == s->self || bit(s->lost, r)) return 0;
    set_bit(s->lost, r), s->nlost++;
    /* everyone learns at once, so that every survivor stops its collective */
    dps_surv_msg_t m = view_msg(s);
    for (int q = 0; q < s->size; q++)
        if (q != s->self && !bit(s->lost, q) && q != coordinator(s)) queue(s, q, &m);
    view_changed(s);
    return 1;
}

void dps_surv_ready(dps_survivors_t *s, uint64_t done)
{
    s->ready = 1, s->done = done;
    view_changed(s);
}

void dps_surv_resume(dps_survivors_t *s)
{
    s->ready = 0;
}

void dps_surv_receive(dps_survivors_t *s, int src, const dps_surv_msg_t *m)
{
    if (src < 0 || src >= s->size) return;
    size_t n = bitmap_bytes(s->size);
    if (m->kind == DPS_SURV_VIEW) {
        peer_view_t *p = &s->peer[src];
        if (p->have && m->seq <= p->seq) return; /* overtaken by a newer view of the sender's */
        if (merge(s, m->bits)) {
            view_changed(s);
            /* the coordinator passes news on: a survivor that never heard of a loss would keep
             * it waiting (the rank that saw it may be lost too) */
            if (coordinator(s) == s->self) {
                dps_surv_msg_t v = view_msg(s);
                for (int q = 0; q < s->size; q++)
                    if (q != s->self && q != src && !bit(s->lost, q)) queue(s, q, &v);
            }
        }
        p->have = 1, p->ready = (unsigned char)(m->ready != 0), p->done = m->done, p->hash = m->view_hash;
        p->seq = m->seq;
        try_decide(s);
    } else if (m->kind == DPS_SURV_DECIDE) {
        if (m->lost <= s->decision.lost && s->decision.lost) return; /* one already adopted */
        /* a decision missing a loss this rank knows is stale: its view is on the way to the
         * coordinator, which decides again */
        for (int r = 0; r < s->size; r++)
            if (bit(s->lost, r) && !bit(m->bits, r)) return;
        if (merge(s, m->bits)) view_changed(s);
        memcpy(s->decided_lost, m->bits, n);
        memcpy(s->decided_laggard, m->bits + n, n);
        s->decision.lost = m->lost, s->decision.cut = m->done, s->decision.root = m->root;
    }
}

int dps_surv_next(dps_survivors_t *s, int *dest, dps_surv_msg_t *m)
{
    if (s->head_out == s->nout) return 0;
    *dest = s->out[s->head_out].dest, *m = s->out[s->head_out].m;
    s->head_out++;
    if (s->head_out == s->nout) s->head_out = s->nout = 0;
    return 1;
}

const dps_surv_decision_t *dps_surv_current(const dps_survivors_t *s)
{
    return s->decision.lost && s->decision.lost == (uint32_t)s->nlost ? &s->decision : NULL;
}

int dps_surv_nlost(const dps_survivors_t *s)
{
    return s->nlost;
}

int dps_surv_is_lost(const dps_survivors_t *s, int r)
{
    return r >= 0 && r < s->size && bit(s->lost, r);
}

void dps_surv_waiting(const dps_survivors_t *s, int *coordinator_p, int *missing)
{
    int c = coordinator(s);
    *coordinator_p = c, *missing = -1;
    if (c != s->self || !s->ready) return;
    uint64_t h = hash_of(s->lost, bitmap_bytes(s->size));
    for (int r = 0; r < s->size && *missing < 0; r++) {
        const peer_view_t *p = &s->peer[r];
        if (r != s->self && !bit(s->lost, r) && !(p->have && p->ready && p->hash == h)) *missing = r;
    }
}

int dps_surv_broken(const dps_survivors_t *s)
{
    return s->broken;
}
