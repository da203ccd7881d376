/* The survivors' agreement (guard/survivors.c) in simulated jobs: ranks lost at the start and
 * during the agreement (the coordinator among them), losses seen by one rank and told to the
 * others, messages delivered in any order between pairs, and now and then out of order within one
 * (a rank's watchdog and main thread both send: MPI keeps each thread's order, not theirs).
 * Every survivor must end with the same decision: the ranks really lost, the cut and root from the
 * survivors' counts; and two ranks never adopt different decisions of one number. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "guard/survivors.h"

enum { MAX_N = 40, MAX_QUEUE = 4096 };

typedef struct pair_queue {
    dps_surv_msg_t *m;
    size_t head, tail;
} pair_queue_t;

static pair_queue_t net[MAX_N][MAX_N];
static unsigned rng;

static unsigned next_random(void)
{
    rng = rng * 1103515245u + 12345u;
    return (rng >> 16) & 0x7fff;
}

static void reset_net(void)
{
    for (int a = 0; a < MAX_N; a++)
        for (int b = 0; b < MAX_N; b++) {
            if (!net[a][b].m) net[a][b].m = malloc(MAX_QUEUE * sizeof(dps_surv_msg_t));
            net[a][b].head = net[a][b].tail = 0;
        }
}

/* One adopted decision, as first seen for its number. */
typedef struct seen {
    int have;
    uint8_t lost[MAX_N], laggard[MAX_N];
    uint64_t cut;
    int root;
} seen_t;

static void note_adoption(int n, const dps_surv_decision_t *d, seen_t *seen, int seed)
{
    seen_t *s = &seen[d->lost];
    uint8_t lost[MAX_N], lag[MAX_N];
    for (int r = 0; r < n; r++)
        lost[r] = d->is_lost[r / 8] >> (r % 8) & 1, lag[r] = d->laggard[r / 8] >> (r % 8) & 1;
    if (!s->have) {
        s->have = 1, s->cut = d->cut, s->root = d->root;
        memcpy(s->lost, lost, (size_t)n), memcpy(s->laggard, lag, (size_t)n);
        return;
    }
    CHECK(!memcmp(s->lost, lost, (size_t)n) && !memcmp(s->laggard, lag, (size_t)n) && s->cut == d->cut &&
              s->root == d->root,
          "seed %d: two decisions numbered %u differ", seed, d->lost);
}

/* One job of n ranks: `first` ranks lost at the start, perhaps one more (a random rank, the
 * coordinator as likely as any) once the agreement is under way. */
static void simulate(int n, int first, int seed)
{
    rng = (unsigned)seed * 2654435761u + 1;
    reset_net();
    dps_survivors_t *s[MAX_N];
    int alive[MAX_N], done[MAX_N], ready[MAX_N] = {0}, adopted_lost[MAX_N] = {0};
    uint64_t base = 1000 + next_random() % 50;
    for (int r = 0; r < n; r++)
        s[r] = dps_surv_new(n, r), alive[r] = 1, done[r] = (int)(base + next_random() % 2);
    /* the lost ones, and who sees each loss */
    int killed = 0;
    while (killed < first) {
        int r = (int)(next_random() % (unsigned)n);
        if (alive[r]) alive[r] = 0, killed++;
    }
    int second = next_random() % 2 ? (int)(next_random() % (unsigned)n) : -1,
        second_at = 5 + next_random() % 60;
    if (second >= 0 && !alive[second]) second = -1;
    if (second >= 0 && killed + 1 >= n) second = -1;
    seen_t seen[MAX_N + 1];
    memset(seen, 0, sizeof seen);
    int seen_by[MAX_N]; /* the one survivor that saw each loss, -1: none yet (or it is lost too) */
    for (int r = 0; r < n; r++)
        seen_by[r] = -1;
    for (int tick = 0; tick < 60000; tick++) {
        if (tick == second_at && second >= 0) alive[second] = 0;
        /* one survivor sees each loss (the guard of its host); the others hear of it, and the loss
         * is seen again only where that survivor is lost too */
        if (next_random() % 4 == 0) {
            int who = (int)(next_random() % (unsigned)n), what = (int)(next_random() % (unsigned)n);
            if (seen_by[what] >= 0 && !alive[seen_by[what]]) seen_by[what] = -1;
            if (alive[who] && !alive[what] && seen_by[what] < 0)
                seen_by[what] = who, dps_surv_lost(s[who], what);
        }
        /* a survivor that knows of a loss stops its collective, some ticks later */
        for (int r = 0; r < n; r++)
            if (alive[r] && !ready[r] && dps_surv_nlost(s[r]) && next_random() % 3 == 0)
                ready[r] = 1, dps_surv_ready(s[r], (uint64_t)done[r]);
        /* outgoing messages onto the wire, now and then (a rank lost meanwhile never sends what it
         * had queued); those to a lost rank go nowhere */
        for (int r = 0; r < n; r++) {
            if (next_random() % 2) continue;
            int dest;
            dps_surv_msg_t m;
            while (alive[r] && dps_surv_next(s[r], &dest, &m)) {
                pair_queue_t *q = &net[r][dest];
                if (q->tail < MAX_QUEUE) q->m[q->tail++] = m;
            }
        }
        /* one message delivered: a random pair, mostly its oldest message, one in four times a
         * later one (it overtook the others) */
        int a = (int)(next_random() % (unsigned)n), b = (int)(next_random() % (unsigned)n);
        pair_queue_t *q = &net[a][b];
        if (q->head < q->tail && alive[b]) {
            size_t k = q->head;
            if (next_random() % 4 == 0) k += next_random() % (q->tail - q->head);
            dps_surv_msg_t m = q->m[k];
            q->m[k] = q->m[q->head++];
            dps_surv_receive(s[b], a, &m);
        }
        for (int r = 0; r < n; r++) {
            const dps_surv_decision_t *d = alive[r] ? dps_surv_current(s[r]) : NULL;
            if (d && (int)d->lost != adopted_lost[r])
                adopted_lost[r] = (int)d->lost, note_adoption(n, d, seen, seed);
        }
    }
    /* the end: every survivor holds the same decision, and it is right */
    int nlost = 0;
    uint64_t cut = 0;
    for (int r = 0; r < n; r++)
        if (!alive[r])
            nlost++;
        else if ((uint64_t)done[r] > cut)
            cut = (uint64_t)done[r];
    int root = -1;
    for (int r = 0; r < n && root < 0; r++)
        if (alive[r] && (uint64_t)done[r] == cut) root = r;
    for (int r = 0; r < n; r++) {
        if (!alive[r]) continue;
        const dps_surv_decision_t *d = dps_surv_current(s[r]);
        CHECK(d != NULL, "seed %d n %d: rank %d holds no current decision (%d lost known, %d lost)", seed, n,
              r, dps_surv_nlost(s[r]), nlost);
        if (!d) continue;
        CHECK((int)d->lost == nlost && d->cut == cut && d->root == root,
              "seed %d n %d: rank %d decided %u lost, cut %llu root %d; truth %d, %llu, %d", seed, n, r,
              d->lost, (unsigned long long)d->cut, d->root, nlost, (unsigned long long)cut, root);
        for (int q = 0; q < n; q++) {
            CHECK((d->is_lost[q / 8] >> (q % 8) & 1) == !alive[q], "seed %d: rank %d's decision on rank %d",
                  seed, r, q);
            if (alive[q])
                CHECK((d->laggard[q / 8] >> (q % 8) & 1) == ((uint64_t)done[q] < cut),
                      "seed %d: rank %d's decision on laggard %d", seed, r, q);
        }
    }
    for (int r = 0; r < n; r++)
        dps_surv_free(s[r]);
}

int main(void)
{
    const int sizes[] = {2, 3, 4, 5, 8, 17, 33};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (int seed = 1; seed <= 60; seed++)
            simulate(sizes[i], 1 + (sizes[i] > 3 && seed % 3 == 0), seed);
    /* the bounds: no agreement object for a job it cannot describe in one message */
    CHECK(dps_surv_new(DPS_SURV_MAX_RANKS + 1, 0) == NULL, "a job too large for one message is refused");
    CHECK(dps_surv_new(4, 4) == NULL, "a rank outside the job is refused");
    /* counts two apart cannot be put back in step: the coordinator says so instead of deciding */
    dps_survivors_t *c = dps_surv_new(3, 0), *o = dps_surv_new(3, 1);
    dps_surv_lost(c, 2);
    dps_surv_ready(c, 10);
    dps_surv_msg_t m;
    int dest;
    while (dps_surv_next(c, &dest, &m))
        if (dest == 1) dps_surv_receive(o, 0, &m);
    dps_surv_ready(o, 12);
    while (dps_surv_next(o, &dest, &m))
        if (dest == 0) dps_surv_receive(c, 1, &m);
    CHECK(dps_surv_broken(c) && !dps_surv_current(c), "counts 10 and 12 are not one decision");
    dps_surv_free(c), dps_surv_free(o);
    /* rank 2 of 4 finds 1 lost, then waits (ready), then finds 3 lost: its view before it was
     * ready reaches the coordinator last. The coordinator still decides once it is ready itself */
    c = dps_surv_new(4, 0), o = dps_surv_new(4, 2);
    dps_surv_msg_t to_c[8];
    int nto_c = 0;
    dps_surv_lost(o, 1);
    dps_surv_ready(o, 6);
    dps_surv_lost(o, 3);
    while (dps_surv_next(o, &dest, &m))
        if (dest == 0 && nto_c < 8) to_c[nto_c++] = m;
    CHECK(nto_c >= 3, "rank 2 told the coordinator three times (%d)", nto_c);
    for (int i = 1; i < nto_c; i++)
        dps_surv_receive(c, 2, &to_c[i]);
    dps_surv_receive(c, 2, &to_c[0]); /* the oldest, last */
    dps_surv_ready(c, 6);
    const dps_surv_decision_t *d = dps_surv_current(c);
    CHECK(d && d->lost == 2 && d->cut == 6 && d->root == 0, "a view overtaken by newer ones is dropped");
    dps_surv_free(c), dps_surv_free(o);
    return check_report("survivors");
}
