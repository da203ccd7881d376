/* The survivors' agreement: after a rank is lost, the ranks left agree on one set of survivors and
 * on where each of them stands, before any of them goes on. Pure logic: the guard's watchdog
 * carries its messages on the side channel, and the main thread reads the decision.
 *
 * Every rank keeps its own view of the lost ranks (what it saw, and what others told it: views
 * only grow). The coordinator is the lowest rank its view does not hold as lost. A rank whose main
 * thread has stopped (it abandoned its collective, or met the loss before starting one) is ready:
 * its position, the number of collectives it completed, is final. When every rank the
 * coordinator holds alive has told it the same view, ready, the coordinator decides: that view,
 * the cut (the most collectives any survivor completed) and the root (the lowest survivor that
 * completed as many), and sends the decision to every survivor. A rank adopts a decision that
 * holds every loss it knows of; one that holds fewer is stale, and its newer view reaches the
 * coordinator, which decides again. A lost coordinator is simply a loss: the next rank decides.
 *
 * A collective completes only where every rank contributed, so no survivor can have completed
 * two more than another: each survivor's count is the cut or one less (a laggard, which takes the
 * cut's result from the root). A decision is named by its number of lost ranks (views only grow,
 * and a coordinator decides once per view), so two decisions of one number are the same. Messages
 * between two ranks may arrive in any order: each carries its sender's sequence number, and a
 * view older than the last one read from its sender is dropped. */
#ifndef DPS_GUARD_SURVIVORS_H
#define DPS_GUARD_SURVIVORS_H

#include <stddef.h>
#include <stdint.h>

/* The largest job the agreement covers: two bitmaps of ranks in one side-channel message. */
#define DPS_SURV_MAX_RANKS 3936

/* Kinds apart from the guard's own messages (watchdog.c), which share the side channel. */
enum { DPS_SURV_VIEW = 101, DPS_SURV_DECIDE = 102 };

typedef struct dps_surv_msg {
    uint32_t kind;      /* DPS_SURV_VIEW or DPS_SURV_DECIDE */
    uint32_t lost;      /* how many ranks the bitmap holds lost (a decision's number) */
    uint32_t ready;     /* VIEW: the sender's main thread waits, and done is final */
    int32_t root;       /* DECIDE: the lowest survivor that completed `done` collectives */
    uint64_t done;      /* VIEW: collectives the sender completed; DECIDE: the cut */
    uint64_t view_hash; /* of the lost bitmap */
    /* the sender's count of messages: two of its threads send (the watchdog and the main thread),
     * so one pair's messages may arrive out of order, and an older view must not replace a newer */
    uint64_t seq;
    uint8_t bits[2 * (DPS_SURV_MAX_RANKS / 8)]; /* the lost ranks; DECIDE: then the laggards */
} dps_surv_msg_t;

typedef struct dps_surv_decision {
    uint32_t lost;                    /* ranks lost; 0: no decision yet */
    uint64_t cut;                     /* collectives completed by the survivors furthest on */
    int root;                         /* the lowest of them */
    const uint8_t *is_lost, *laggard; /* bitmaps of the job's ranks */
} dps_surv_decision_t;

typedef struct dps_survivors dps_survivors_t;

/* NULL where memory is short or the job is larger than DPS_SURV_MAX_RANKS. */
dps_survivors_t *dps_surv_new(int size, int self);
void dps_surv_free(dps_survivors_t *s);
/* This rank found rank r lost: 1 where that is news (every survivor is then told), else 0. */
int dps_surv_lost(dps_survivors_t *s, int r);
/* The main thread waits for a decision, having completed `done` collectives. */
void dps_surv_ready(dps_survivors_t *s, uint64_t done);
/* The main thread goes on (after adopting a decision): it is no longer ready. */
void dps_surv_resume(dps_survivors_t *s);
/* A message of the agreement from rank src. */
void dps_surv_receive(dps_survivors_t *s, int src, const dps_surv_msg_t *m);
/* The next message to send: 1 with *dest and *m set, 0 where none is due. */
int dps_surv_next(dps_survivors_t *s, int *dest, dps_surv_msg_t *m);
/* The decision this rank adopted where it holds every loss this rank knows of; NULL otherwise. */
const dps_surv_decision_t *dps_surv_current(const dps_survivors_t *s);
/* Ranks this rank holds lost, and whether r is one of them. */
int dps_surv_nlost(const dps_survivors_t *s);
int dps_surv_is_lost(const dps_survivors_t *s, int r);
/* 1 where the survivors' counts are further apart than one collective: they did not run the same
 * collectives, and no decision can put them back in step (the job must end). */
int dps_surv_broken(const dps_survivors_t *s);
/* Who an undecided agreement waits for, for messages: the coordinator (this rank or another),
 * and on the coordinator the first rank whose ready view, the same as its own, has not come
 * (-1: none, or this rank is not ready itself). */
void dps_surv_waiting(const dps_survivors_t *s, int *coordinator, int *missing);

#endif
