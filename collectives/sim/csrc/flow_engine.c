/* The event loop of treecoll's flow engine (collectives/sim/engine.py, FlowEngine and the executor's
 * ExecutorEngine in collectives/sim/executor.py) in C: the same events, in the same order, with the same
 * floating-point operations in the same order, so the same numbers to the last bit.
 *
 * Inputs are flat arrays built by collectives/sim/engine_native.py (steps of every rank, their
 * dependencies, the route of every send, the links' capacities); outputs are the completion time of
 * every step, the bytes per link, the peak scratch per rank, the counters and the order in which the
 * run first used each link (the Python engine numbers links in that order).
 *
 * Build without -ffast-math and with -ffp-contract=off: a fused multiply-add would change the numbers.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int64_t i64;

#define REL_EPS 1e-9
enum { K_SEND = 0, K_RECV = 1, K_REDUCE = 2 };
enum { EV_ARRIVAL = 0, EV_REDUCE_DONE = 1, EV_ISSUE = 2 };

/* ------------------------------------------------------------------ growable arrays */
static int grow(void **p, i64 *cap, i64 need, size_t elem) {
    if (need <= *cap) return 0;
    i64 c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}
#define GROW(arr, capv, need) grow((void **)&(arr), &(capv), (need), sizeof(*(arr)))

static int regrow(void **p, i64 n, size_t elem) {
    void *q = realloc(*p, (size_t)n * elem);
    if (!q) return -1;
    *p = q;
    return 0;
}
#define REGROW(arr, n) regrow((void **)&(arr), (n), sizeof(*(arr)))

static i64 new_cap(i64 cap, i64 need) {
    i64 c = cap ? cap : 1024;
    while (c < need) c *= 2;
    return c;
}

/* ------------------------------------------------------------------ a hash map of 4 int64 -> int64 */
#define HM_EMPTY INT64_MIN /* k[0] of a free slot (keys are ids >= 0) */

typedef struct {
    i64 k[4], v; /* a slot: key and value on one cache line */
} hm_entry;

typedef struct {
    hm_entry *e;
    i64 cap, n;
} hmap;

static uint64_t hkey(const i64 *k) {
    uint64_t h = 1469598103934665603ULL;
    for (int j = 0; j < 4; j++) {
        h ^= (uint64_t)k[j] + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdULL;
    }
    return h ^ (h >> 33);
}

static int hm_init(hmap *m, i64 expect) {
    i64 c = 64;
    while (c < 2 * expect + 16) c *= 2;
    m->cap = c;
    m->n = 0;
    m->e = malloc((size_t)c * sizeof(hm_entry));
    if (!m->e) return -1;
    for (i64 s = 0; s < c; s++) m->e[s].k[0] = HM_EMPTY;
    return 0;
}

static void hm_free(hmap *m) { free(m->e); }

static i64 hm_slot(const hmap *m, const i64 *k) {
    i64 s = (i64)(hkey(k) & (uint64_t)(m->cap - 1));
    while (m->e[s].k[0] != HM_EMPTY) {
        const i64 *q = m->e[s].k;
        if (q[0] == k[0] && q[1] == k[1] && q[2] == k[2] && q[3] == k[3]) return s;
        s = (s + 1) & (m->cap - 1);
    }
    return s;
}

static int hm_rehash(hmap *m) {
    hmap o = *m;
    if (hm_init(m, o.cap) != 0) return -1;
    for (i64 s = 0; s < o.cap; s++)
        if (o.e[s].k[0] != HM_EMPTY) {
            m->e[hm_slot(m, o.e[s].k)] = o.e[s];
            m->n++;
        }
    hm_free(&o);
    return 0;
}

/* the value of key (a, b, c, d), or -1 */
static i64 hm_get(const hmap *m, i64 a, i64 b, i64 c, i64 d) {
    i64 k[4] = {a, b, c, d};
    i64 s = hm_slot(m, k);
    return m->e[s].k[0] != HM_EMPTY ? m->e[s].v : -1;
}

/* a pointer to the value of key (a, b, c, d), inserted with value `init` when new (NULL: out of memory) */
static i64 *hm_ref(hmap *m, i64 a, i64 b, i64 c, i64 d, i64 init) {
    i64 k[4] = {a, b, c, d};
    i64 s = hm_slot(m, k);
    if (m->e[s].k[0] == HM_EMPTY) {
        if (2 * (m->n + 1) > m->cap) {
            if (hm_rehash(m) != 0) return NULL;
            s = hm_slot(m, k);
        }
        memcpy(m->e[s].k, k, sizeof(k));
        m->e[s].v = init;
        m->n++;
    }
    return &m->e[s].v;
}

/* ------------------------------------------------------------------ heaps */
typedef struct {
    double t;
    i64 seq;
    i64 kind, a, b;
} event;

typedef struct {
    double end, within;
    i64 f;
} fin_entry;

static int ev_less(const event *x, const event *y) { return x->t < y->t || (x->t == y->t && x->seq < y->seq); }

static int fin_less(const fin_entry *x, const fin_entry *y) {
    if (x->end != y->end) return x->end < y->end;
    if (x->within != y->within) return x->within < y->within;
    return x->f < y->f;
}

/* binary min-heaps of T ordered by less (pops come in that order: the orders are total) */
#define DEFINE_HEAP(T, less)                                                                                      \
    static void T##_push(T *h, i64 *n, T x) {                                                                    \
        i64 i = (*n)++;                                                                                          \
        while (i > 0) {                                                                                          \
            i64 p = (i - 1) / 2;                                                                                 \
            if (!less(&x, &h[p])) break;                                                                         \
            h[i] = h[p];                                                                                         \
            i = p;                                                                                               \
        }                                                                                                        \
        h[i] = x;                                                                                                \
    }                                                                                                            \
    static void T##_pop(T *h, i64 *n) {                                                                          \
        T last = h[--(*n)];                                                                                      \
        i64 i = 0;                                                                                               \
        for (;;) {                                                                                               \
            i64 c = 2 * i + 1;                                                                                   \
            if (c >= *n) break;                                                                                  \
            if (c + 1 < *n && less(&h[c + 1], &h[c])) c++;                                                       \
            if (!less(&h[c], &last)) break;                                                                      \
            h[i] = h[c];                                                                                         \
            i = c;                                                                                               \
        }                                                                                                        \
        if (*n > 0) h[i] = last;                                                                                 \
    }

DEFINE_HEAP(event, ev_less)

/* ------------------------------------------------------------------ the arguments (engine_native._Args) */
typedef struct {
    i64 nranks, nsteps, nchunks, nroutes, nlinks;
    const i64 *step_off;   /* [nranks + 1] first global step of each rank */
    const int8_t *kind;    /* [nsteps] K_SEND / K_RECV / K_REDUCE */
    const i64 *chunk;      /* [nsteps] */
    const i64 *peer;       /* [nsteps] */
    const i64 *slot;       /* [nsteps] */
    const i64 *lane;       /* [nsteps] */
    const i64 *dep_ptr;    /* [nsteps + 1] into dep_idx */
    const i64 *dep_idx;    /* the rank's own step indices */
    const i64 *route_of;   /* [nsteps] route of a send step (-1 for other steps) */
    const double *chunk_f; /* [nchunks] bytes */
    const double *mem_bw;  /* [nranks] bytes/s */
    const double *r_lat;   /* [nroutes] s */
    const i64 *r_sub_ptr;  /* [nroutes + 1] into the subroutes (a subflow each where its share > 0) */
    const double *s_share; /* [nsubs] */
    const i64 *s_link_ptr; /* [nsubs + 1] into s_links */
    const i64 *s_links;
    const double *cap; /* [nlinks] bytes/s */
    i64 reduce_cost, ordered_pairs, rendezvous, lanes, executor;
    double step_cost;
    /* outputs */
    double *done_t;       /* [nsteps] NAN: never completed */
    double *link_bytes;   /* [nlinks] */
    double *peak_scratch; /* [nranks] */
    double *finish;       /* [nranks] */
    i64 *link_order;      /* [nlinks] links in the order the run first used them */
    i64 n_order, transfers, subflows, recomputes;
} fe_args;

/* ------------------------------------------------------------------ the engine's state */
typedef struct {
    i64 *f, *inc, n, cap;
} link_users; /* the draining subflows over one link, with the incidence that put each there */

typedef struct {
    fe_args *A;
    double now;
    int oom;
    /* ranks and steps */
    i64 *q_off;      /* [nranks + 1] first stream of each rank */
    i64 *q_ptr;      /* [nstreams + 1] into q_steps */
    i64 *q_steps;    /* local step indices */
    i64 *q_pos;      /* [nstreams] next position */
    char *q_ready;   /* [nstreams] */
    i64 *n_ready;    /* [nranks] ready streams */
    i64 *blocked_head; /* [nsteps] first stream waiting for the step, -1 */
    i64 *blocked_next; /* [nstreams] */
    double *compute_free, *cpu_free;
    i64 *step_rank;  /* [nsteps] the rank of each step */
    /* messages: a send's receive step (global), its connection, the next send queued after it */
    hmap msg, send_count, conns, open_slot;
    i64 *send_recv, *send_conn, *send_next;
    char *posted, *waiting, *has_arrived;
    double *arrived_t;
    i64 *held;      /* [nsteps] per receive step: the held send (global), -1 */
    char *c_exists; /* per connection: whether it has a queue (a message drains) */
    i64 *c_head, *c_tail, *c_rank, nconn, c_cap;
    double *slot_val;
    char *slot_present;
    i64 nslot, slot_cap;
    /* scratch events */
    i64 *sc_rank;
    double *sc_t, *sc_b;
    i64 nsc, sc_cap;
    /* transfers */
    i64 *x_send, *x_pending, *x_route, nx, x_cap;
    /* subflows */
    double *f_rem, *f_tlast, *f_rate, *f_size;
    i64 *f_xfer, *f_hpos, *f_sub, *f_inc; /* f_hpos: the subflow's place in the drain heap fh, -1 */
    i64 nf, f_cap;
    i64 *inc_pos; /* per incidence: its position in its link's users (-1: the link repeats in the subflow) */
    i64 ninc, inc_cap;
    link_users *on_link;
    /* dirty links */
    i64 *dirty;
    i64 ndirty, dirty_cap;
    i64 *dirty_mark, *seen_l, *seen_f, *loc, epoch;
    char *route_seen, *link_seen;
    int changed;
    /* heaps */
    event *ev;
    i64 nev, ev_cap, seq;
    /* the executor's deferred sends and receives, per rank in the order pushed (which is their order on
     * the heap: a rank's CPU frees up later each time), in the rank's step range; only the first of each
     * rank is on the heap (a k-way merge: the same pops as all of them on the heap, a smaller heap) */
    double *iq_t;
    i64 *iq_seq, *iq_step, *iq_head, *iq_tail;
    fin_entry *fh; /* the drain time of every draining subflow with a rate > 0, one entry each */
    i64 nfh, fh_cap;
    /* filling scratch */
    i64 *comp, ncomp, comp_cap;
    i64 *stack, stack_cap;
    i64 *l_ids, *l_cnt, *l_uptr, *l_users, *l_fill, *f_lptr, *f_ll, *live, *bott;
    double *l_rem, *l_share, *c_rate;
    char *c_frozen;
    i64 l_cap, u_cap, cf_cap;
} engine;

static void on_link_add(engine *E, i64 lk, i64 f, i64 inc) {
    link_users *u = &E->on_link[lk];
    if (u->n == u->cap) {
        i64 c = u->cap ? 2 * u->cap : 4;
        i64 *nf = realloc(u->f, (size_t)c * sizeof(i64)), *ni;
        if (!nf) {
            E->oom = 1;
            return;
        }
        u->f = nf;
        ni = realloc(u->inc, (size_t)c * sizeof(i64));
        if (!ni) {
            E->oom = 1;
            return;
        }
        u->inc = ni;
        u->cap = c;
    }
    E->inc_pos[inc] = u->n;
    u->f[u->n] = f;
    u->inc[u->n] = inc;
    u->n++;
}

static void on_link_remove(engine *E, i64 lk, i64 inc) {
    link_users *u = &E->on_link[lk];
    i64 p = E->inc_pos[inc], last = u->n - 1;
    if (p != last) {
        u->f[p] = u->f[last];
        u->inc[p] = u->inc[last];
        E->inc_pos[u->inc[p]] = p;
    }
    u->n--;
}

static void mark_dirty(engine *E, i64 lk) {
    if (E->dirty_mark[lk] == E->epoch) return;
    E->dirty_mark[lk] = E->epoch;
    if (GROW(E->dirty, E->dirty_cap, E->ndirty + 1)) {
        E->oom = 1;
        return;
    }
    E->dirty[E->ndirty++] = lk;
}

static void push_event(engine *E, double t, i64 kind, i64 a, i64 b) {
    if (GROW(E->ev, E->ev_cap, E->nev + 1)) {
        E->oom = 1;
        return;
    }
    event x = {t, E->seq++, kind, a, b};
    event_push(E->ev, &E->nev, x);
}

static void advance(engine *E, i64 r, double t);
static void send_when_posted(engine *E, i64 r, i64 g, double t);

static void scratch_event(engine *E, i64 r, double t, double b) {
    if (E->nsc == E->sc_cap) {
        i64 c = new_cap(E->sc_cap, E->nsc + 1);
        if (REGROW(E->sc_rank, c) || REGROW(E->sc_t, c) || REGROW(E->sc_b, c)) {
            E->oom = 1;
            return;
        }
        E->sc_cap = c;
    }
    E->sc_rank[E->nsc] = r;
    E->sc_t[E->nsc] = t;
    E->sc_b[E->nsc] = b;
    E->nsc++;
}

/* step g (global) of rank r completed at t: wake the streams waiting for it; a reduce frees its slot */
static void complete(engine *E, i64 r, i64 g, double t) {
    const fe_args *A = E->A;
    E->A->done_t[g] = t;
    i64 q = E->blocked_head[g];
    E->blocked_head[g] = -1;
    while (q >= 0) {
        i64 nxt = E->blocked_next[q];
        if (!E->q_ready[q]) {
            E->q_ready[q] = 1;
            E->n_ready[r]++;
        }
        q = nxt;
    }
    if (A->kind[g] == K_REDUCE) {
        i64 si = hm_get(&E->open_slot, r, A->chunk[g], A->slot[g], 0);
        if (si >= 0 && E->slot_present[si]) {
            E->slot_present[si] = 0;
            scratch_event(E, r, t, -E->slot_val[si]);
        }
    }
}

static void release(engine *E, i64 c, double t);

/* the message of send g starts to move: one subflow per route of the pair (none for 0 bytes) */
static void transmit(engine *E, i64 r, i64 g, double t) {
    fe_args *A = E->A;
    i64 rt = A->route_of[g];
    double n = A->chunk_f[A->chunk[g]];
    i64 xi = E->nx;
    if (xi == E->x_cap) {
        i64 c = new_cap(E->x_cap, xi + 1);
        if (REGROW(E->x_send, c) || REGROW(E->x_pending, c) || REGROW(E->x_route, c)) {
            E->oom = 1;
            return;
        }
        E->x_cap = c;
    }
    E->x_send[xi] = g;
    E->x_route[xi] = rt;
    E->nx++;
    if (!E->route_seen[rt]) { /* the Python engine numbers a route's links when it first uses the route */
        E->route_seen[rt] = 1;
        for (i64 j = A->s_link_ptr[A->r_sub_ptr[rt]]; j < A->s_link_ptr[A->r_sub_ptr[rt + 1]]; j++) {
            i64 lk = A->s_links[j];
            if (!E->link_seen[lk]) {
                E->link_seen[lk] = 1;
                A->link_order[A->n_order++] = lk;
            }
        }
    }
    i64 cnt = 0;
    if (n > 0) {
        for (i64 s = A->r_sub_ptr[rt]; s < A->r_sub_ptr[rt + 1]; s++) {
            if (!(A->s_share[s] > 0)) continue; /* a subroute with no share: no subflow */
            cnt++;
            i64 f = E->nf;
            i64 nl = A->s_link_ptr[s + 1] - A->s_link_ptr[s];
            if (f == E->f_cap) {
                i64 c = new_cap(E->f_cap, f + 1);
                if (REGROW(E->f_rem, c) || REGROW(E->f_tlast, c) || REGROW(E->f_rate, c) || REGROW(E->f_size, c) ||
                    REGROW(E->f_xfer, c) || REGROW(E->f_hpos, c) || REGROW(E->f_sub, c) || REGROW(E->f_inc, c) ||
                    REGROW(E->seen_f, c)) {
                    E->oom = 1;
                    return;
                }
                E->f_cap = c;
            }
            if (GROW(E->inc_pos, E->inc_cap, E->ninc + nl)) {
                E->oom = 1;
                return;
            }
            double sz = A->s_share[s] * n;
            E->f_rem[f] = sz;
            E->f_size[f] = sz;
            E->f_tlast[f] = t;
            E->f_rate[f] = 0.0;
            E->f_xfer[f] = xi;
            E->f_hpos[f] = -1;
            E->f_sub[f] = s;
            E->f_inc[f] = E->ninc;
            E->seen_f[f] = 0;
            const i64 *ls = A->s_links + A->s_link_ptr[s];
            for (i64 j = 0; j < nl; j++) {
                i64 inc = E->ninc + j, dup = 0;
                for (i64 j2 = 0; j2 < j; j2++)
                    if (ls[j2] == ls[j]) dup = 1;
                if (dup)
                    E->inc_pos[inc] = -1;
                else
                    on_link_add(E, ls[j], f, inc);
                mark_dirty(E, ls[j]);
            }
            E->ninc += nl;
            E->nf++;
        }
    }
    E->x_pending[xi] = cnt;
    if (cnt == 0) {
        complete(E, r, g, t);
        push_event(E, t + A->r_lat[rt], EV_ARRIVAL, xi, 0);
        release(E, E->send_conn[g], t);
    } else {
        E->changed = 1;
    }
}

/* with rendezvous, data moves only once the receiver has posted the matching recv */
static void send_when_posted(engine *E, i64 r, i64 g, double t) {
    const fe_args *A = E->A;
    if (A->rendezvous && A->chunk_f[A->chunk[g]] > 0) {
        i64 rv = E->send_recv[g];
        if (rv < 0) return; /* no receive will ever be posted: held forever */
        if (!E->posted[rv]) {
            E->held[rv] = g;
            return;
        }
    }
    transmit(E, r, g, t);
}

/* connection c is free: start its next waiting message, if any */
static void release(engine *E, i64 c, double t) {
    if (!E->c_exists[c]) return;
    i64 g = E->c_head[c];
    if (g >= 0) {
        E->c_head[c] = E->send_next[g];
        if (E->c_head[c] < 0) E->c_tail[c] = -1;
        send_when_posted(E, E->c_rank[c], g, t);
    } else {
        E->c_exists[c] = 0;
    }
}

/* name the message; with ordered_pairs it goes after the connection's earlier messages */
static void start_send(engine *E, i64 r, i64 i, double t) {
    const fe_args *A = E->A;
    i64 g = A->step_off[r] + i, peer = A->peer[g], ch = A->chunk[g];
    i64 *cnt = hm_ref(&E->send_count, r, peer, ch, 0, 0);
    if (!cnt) {
        E->oom = 1;
        return;
    }
    i64 k = (*cnt)++;
    E->send_recv[g] = hm_get(&E->msg, r, peer, ch, k);
    i64 ln = A->lanes ? A->lane[g] : 0;
    i64 *ci = hm_ref(&E->conns, r, peer, ln, 0, E->nconn);
    if (!ci) {
        E->oom = 1;
        return;
    }
    i64 c = *ci;
    if (c == E->nconn) {
        if (c == E->c_cap) {
            i64 cc = new_cap(E->c_cap, c + 1);
            if (REGROW(E->c_exists, cc) || REGROW(E->c_head, cc) || REGROW(E->c_tail, cc) || REGROW(E->c_rank, cc)) {
                E->oom = 1;
                return;
            }
            E->c_cap = cc;
        }
        E->c_exists[c] = 0;
        E->c_head[c] = E->c_tail[c] = -1;
        E->c_rank[c] = r;
        E->nconn++;
    }
    E->send_conn[g] = c;
    if (A->ordered_pairs && A->chunk_f[ch] > 0) {
        if (E->c_exists[c]) { /* the connection is busy: go after its earlier messages */
            E->send_next[g] = -1;
            if (E->c_tail[c] >= 0)
                E->send_next[E->c_tail[c]] = g;
            else
                E->c_head[c] = g;
            E->c_tail[c] = g;
            return;
        }
        E->c_exists[c] = 1;
        E->c_head[c] = E->c_tail[c] = -1;
    }
    send_when_posted(E, r, g, t);
}

/* a recv into slot >= 1 holds scratch until its reduce; it completes when its data has arrived */
static void post_recv(engine *E, i64 r, i64 i, double t) {
    const fe_args *A = E->A;
    i64 g = A->step_off[r] + i;
    if (A->slot[g] > 0) {
        double b = A->chunk_f[A->chunk[g]];
        scratch_event(E, r, t, b);
        i64 *si = hm_ref(&E->open_slot, r, A->chunk[g], A->slot[g], 0, E->nslot);
        if (!si) {
            E->oom = 1;
            return;
        }
        if (*si == E->nslot) {
            if (E->nslot == E->slot_cap) {
                i64 c = new_cap(E->slot_cap, E->nslot + 1);
                if (REGROW(E->slot_val, c) || REGROW(E->slot_present, c)) {
                    E->oom = 1;
                    return;
                }
                E->slot_cap = c;
            }
            E->slot_present[E->nslot] = 0;
            E->nslot++;
        }
        i64 s = *si;
        E->slot_val[s] = (E->slot_present[s] ? E->slot_val[s] : 0.0) + b;
        E->slot_present[s] = 1;
    }
    if (A->rendezvous) {
        E->posted[g] = 1;
        i64 h = E->held[g];
        if (h >= 0) {
            E->held[g] = -1;
            transmit(E, A->peer[g], h, t);
        }
    }
    if (E->has_arrived[g]) {
        E->has_arrived[g] = 0;
        double a = E->arrived_t[g];
        complete(E, r, g, a > t ? a : t);
    } else {
        E->waiting[g] = 1;
    }
}

static void start_reduce(engine *E, i64 r, i64 i, double t) {
    const fe_args *A = E->A;
    i64 g = A->step_off[r] + i;
    if (A->executor) {
        double begin = t;
        if (E->cpu_free[r] > begin) begin = E->cpu_free[r];
        if (E->compute_free[r] > begin) begin = E->compute_free[r];
        if (begin > t) E->compute_free[r] = begin;
    }
    double mem_bw = A->mem_bw[r];
    double dur = (A->reduce_cost && mem_bw > 0) ? 3.0 * A->chunk_f[A->chunk[g]] / mem_bw : 0.0;
    double begin = E->compute_free[r] > t ? E->compute_free[r] : t;
    if (dur == 0.0 && begin <= t) {
        complete(E, r, g, t);
    } else {
        E->compute_free[r] = begin + dur;
        push_event(E, begin + dur, EV_REDUCE_DONE, r, i);
    }
    if (A->executor && E->compute_free[r] > E->cpu_free[r]) E->cpu_free[r] = E->compute_free[r];
}

/* the executor: a send or receive takes effect step_cost after the rank's CPU is free */
static void issue(engine *E, i64 r, i64 i, double t, int is_send) {
    double at = (E->cpu_free[r] > t ? E->cpu_free[r] : t) + E->A->step_cost;
    E->cpu_free[r] = at;
    if (at <= t) {
        if (is_send)
            start_send(E, r, i, t);
        else
            post_recv(E, r, i, t);
    } else if (E->A->step_cost < 0) { /* the rank's issue times could go back: the heap alone orders them */
        push_event(E, at, EV_ISSUE, r, i);
    } else {
        i64 q = E->A->step_off[r] + E->iq_tail[r]++;
        E->iq_t[q] = at;
        E->iq_seq[q] = E->seq;
        E->iq_step[q] = i;
        if (E->iq_head[r] + 1 == E->iq_tail[r])
            push_event(E, at, EV_ISSUE, r, i); /* the first waiting: on the heap, with the same number */
        else
            E->seq++;
    }
}

/* the executor's deferred step of rank r on top of the heap was popped: its next one goes on the heap */
static void next_issue(engine *E, i64 r) {
    if (E->A->step_cost < 0) return;
    if (++E->iq_head[r] == E->iq_tail[r]) return;
    i64 q = E->A->step_off[r] + E->iq_head[r];
    if (GROW(E->ev, E->ev_cap, E->nev + 1)) {
        E->oom = 1;
        return;
    }
    event x = {E->iq_t[q], E->iq_seq[q], EV_ISSUE, r, E->iq_step[q]};
    event_push(E->ev, &E->nev, x);
}

/* start every step of rank r that can start at t */
static void advance(engine *E, i64 r, double t) {
    const fe_args *A = E->A;
    i64 q0 = E->q_off[r], off = A->step_off[r];
    while (E->n_ready[r] > 0 && !E->oom) {
        i64 qi = q0;
        while (!E->q_ready[qi]) qi++; /* lowest stream first: deterministic */
        E->q_ready[qi] = 0;
        E->n_ready[r]--;
        i64 n = E->q_ptr[qi + 1] - E->q_ptr[qi];
        const i64 *q = E->q_steps + E->q_ptr[qi];
        while (E->q_pos[qi] < n) {
            i64 i = q[E->q_pos[qi]], g = off + i, wait = -1;
            for (i64 d = A->dep_ptr[g]; d < A->dep_ptr[g + 1]; d++)
                if (isnan(E->A->done_t[off + A->dep_idx[d]])) {
                    wait = A->dep_idx[d];
                    break;
                }
            if (wait >= 0) { /* streams waiting for one step: a list (the order does not matter) */
                E->blocked_next[qi] = E->blocked_head[off + wait];
                E->blocked_head[off + wait] = qi;
                break;
            }
            E->q_pos[qi]++;
            int8_t k = A->kind[g];
            if (k == K_SEND) {
                if (A->executor)
                    issue(E, r, i, t, 1);
                else
                    start_send(E, r, i, t);
            } else if (k == K_RECV) {
                if (A->executor)
                    issue(E, r, i, t, 0);
                else
                    post_recv(E, r, i, t);
            } else {
                start_reduce(E, r, i, t);
            }
            if (E->oom) return;
        }
    }
}

/* message of receive step rv has arrived at t: its posted recv completes, or it waits for one */
static void deliver(engine *E, i64 rv, double t) {
    if (rv < 0) return;
    if (E->waiting[rv]) {
        E->waiting[rv] = 0;
        i64 r = E->step_rank[rv];
        complete(E, r, rv, t);
        if (E->n_ready[r]) advance(E, r, t);
    } else {
        E->has_arrived[rv] = 1;
        E->arrived_t[rv] = t;
    }
}

/* ------------------------------------------------------------------ rates */
static int fill_alloc(engine *E, i64 nl, i64 ninc, i64 nf) {
    if (nl > E->l_cap) {
        i64 c = nl * 2;
        free(E->l_ids), free(E->l_cnt), free(E->l_uptr), free(E->l_fill), free(E->live), free(E->bott);
        free(E->l_rem), free(E->l_share);
        E->l_ids = malloc(c * sizeof(i64)), E->l_cnt = malloc(c * sizeof(i64));
        E->l_uptr = malloc((c + 1) * sizeof(i64)), E->l_fill = malloc(c * sizeof(i64));
        E->live = malloc(c * sizeof(i64)), E->bott = malloc(c * sizeof(i64));
        E->l_rem = malloc(c * sizeof(double)), E->l_share = malloc(c * sizeof(double));
        E->l_cap = c;
        if (!E->l_ids || !E->l_cnt || !E->l_uptr || !E->l_fill || !E->live || !E->bott || !E->l_rem || !E->l_share)
            return -1;
    }
    if (ninc > E->u_cap) {
        i64 c = ninc * 2;
        free(E->l_users), free(E->f_ll);
        E->l_users = malloc(c * sizeof(i64)), E->f_ll = malloc(c * sizeof(i64));
        E->u_cap = c;
        if (!E->l_users || !E->f_ll) return -1;
    }
    if (nf > E->cf_cap) {
        i64 c = nf * 2;
        free(E->f_lptr), free(E->c_rate), free(E->c_frozen);
        E->f_lptr = malloc((c + 1) * sizeof(i64)), E->c_rate = malloc(c * sizeof(double));
        E->c_frozen = malloc(c);
        E->cf_cap = c;
        if (!E->f_lptr || !E->c_rate || !E->c_frozen) return -1;
    }
    return 0;
}

/* max-min rates of the subflows comp[0..nf-1] by progressive filling: engine._fill_small's operations on
 * the same numbers (per link: unfrozen subflows, capacity left; the least share; every live link less
 * count x share), which do not depend on the order of subflows or links */
static int fill(engine *E, const i64 *comp, i64 nf) {
    const fe_args *A = E->A;
    i64 nl = 0, ninc = 0;
    E->epoch++;
    for (i64 a = 0; a < nf; a++) {
        i64 s = E->f_sub[comp[a]];
        ninc += A->s_link_ptr[s + 1] - A->s_link_ptr[s];
    }
    if (fill_alloc(E, ninc, ninc, nf)) return -1;
    E->f_lptr[0] = 0;
    for (i64 a = 0; a < nf; a++) { /* dense link indices, counts, each subflow's dense links */
        i64 s = E->f_sub[comp[a]], p = E->f_lptr[a];
        for (i64 j = A->s_link_ptr[s]; j < A->s_link_ptr[s + 1]; j++) {
            i64 lk = A->s_links[j];
            if (E->seen_l[lk] != E->epoch) {
                E->seen_l[lk] = E->epoch;
                E->loc[lk] = nl;
                E->l_ids[nl] = lk;
                E->l_cnt[nl] = 0;
                nl++;
            }
            i64 d = E->loc[lk];
            E->l_cnt[d]++;
            E->f_ll[p++] = d;
        }
        E->f_lptr[a + 1] = p;
        E->c_frozen[a] = 0;
        E->c_rate[a] = 0.0;
    }
    E->l_uptr[0] = 0;
    for (i64 d = 0; d < nl; d++) {
        E->l_uptr[d + 1] = E->l_uptr[d] + E->l_cnt[d];
        E->l_fill[d] = E->l_uptr[d];
        E->l_rem[d] = A->cap[E->l_ids[d]];
        E->live[d] = d;
    }
    for (i64 a = 0; a < nf; a++)
        for (i64 p = E->f_lptr[a]; p < E->f_lptr[a + 1]; p++) E->l_users[E->l_fill[E->f_ll[p]]++] = a;
    i64 left = nf, nlive = nl;
    double level = 0.0;
    const double one_eps = 1 + REL_EPS;
    while (left > 0) {
        if (nlive == 0) return -3; /* a subflow without links: cannot happen */
        double mn = INFINITY;
        for (i64 x = 0; x < nlive; x++) {
            i64 d = E->live[x];
            double sh = E->l_rem[d] / (double)E->l_cnt[d];
            E->l_share[d] = sh;
            if (x == 0 || sh < mn) mn = sh;
        }
        double m = (0.0 > mn) ? 0.0 : mn;
        double thr = m * one_eps + 1e-12;
        i64 nb = 0;
        for (i64 x = 0; x < nlive; x++) {
            i64 d = E->live[x];
            if (E->l_share[d] <= thr) E->bott[nb++] = d;
        }
        for (i64 x = 0; x < nlive; x++) {
            i64 d = E->live[x];
            double v = E->l_rem[d] - (double)E->l_cnt[d] * m;
            E->l_rem[d] = v > 0.0 ? v : 0.0;
        }
        level += m;
        for (i64 y = 0; y < nb; y++) {
            i64 d = E->bott[y];
            for (i64 u = E->l_uptr[d]; u < E->l_uptr[d + 1]; u++) {
                i64 a = E->l_users[u];
                if (E->c_frozen[a]) continue;
                E->c_frozen[a] = 1;
                E->c_rate[a] = level;
                left--;
                for (i64 p = E->f_lptr[a]; p < E->f_lptr[a + 1]; p++) E->l_cnt[E->f_ll[p]]--;
            }
        }
        i64 w = 0;
        for (i64 x = 0; x < nlive; x++)
            if (E->l_cnt[E->live[x]] > 0) E->live[w++] = E->live[x];
        nlive = w;
    }
    return 0;
}

/* the draining subflows connected to the dirty links through shared links */
static int component(engine *E) {
    const fe_args *A = E->A;
    E->epoch++;
    i64 ns = 0;
    E->ncomp = 0;
    if (GROW(E->stack, E->stack_cap, E->ndirty + 1)) return -1;
    for (i64 x = 0; x < E->ndirty; x++) {
        i64 lk = E->dirty[x];
        if (E->seen_l[lk] == E->epoch) continue;
        E->seen_l[lk] = E->epoch;
        E->stack[ns++] = lk;
    }
    while (ns > 0) {
        i64 lk = E->stack[--ns];
        link_users *u = &E->on_link[lk];
        for (i64 y = 0; y < u->n; y++) {
            i64 f = u->f[y];
            if (E->seen_f[f] == E->epoch) continue;
            E->seen_f[f] = E->epoch;
            if (GROW(E->comp, E->comp_cap, E->ncomp + 1)) return -1;
            E->comp[E->ncomp++] = f;
            i64 s = E->f_sub[f];
            for (i64 j = A->s_link_ptr[s]; j < A->s_link_ptr[s + 1]; j++) {
                i64 l2 = A->s_links[j];
                if (E->seen_l[l2] == E->epoch) continue;
                E->seen_l[l2] = E->epoch;
                if (GROW(E->stack, E->stack_cap, ns + 1)) return -1;
                E->stack[ns++] = l2;
            }
        }
    }
    return 0;
}

/* The drain heap: a binary min-heap of fin_entry by fin_less, indexed by subflow (f_hpos), so that a
 * new rate moves the subflow's one entry instead of adding one (the pops come in the same order). */
static void fh_place(engine *E, i64 i, fin_entry x) {
    E->fh[i] = x;
    E->f_hpos[x.f] = i;
}

static void fh_up(engine *E, i64 i, fin_entry x) {
    while (i > 0) {
        i64 p = (i - 1) / 2;
        if (!fin_less(&x, &E->fh[p])) break;
        fh_place(E, i, E->fh[p]);
        i = p;
    }
    fh_place(E, i, x);
}

static void fh_down(engine *E, i64 i, fin_entry x) {
    for (;;) {
        i64 c = 2 * i + 1;
        if (c >= E->nfh) break;
        if (c + 1 < E->nfh && fin_less(&E->fh[c + 1], &E->fh[c])) c++;
        if (!fin_less(&E->fh[c], &x)) break;
        fh_place(E, i, E->fh[c]);
        i = c;
    }
    fh_place(E, i, x);
}

/* the entry of subflow x.f set to x (inserted when it has none) */
static int fh_set(engine *E, fin_entry x) {
    i64 i = E->f_hpos[x.f];
    if (i < 0) {
        if (GROW(E->fh, E->fh_cap, E->nfh + 1)) return -1;
        fh_up(E, E->nfh++, x);
    } else if (fin_less(&x, &E->fh[i])) {
        fh_up(E, i, x);
    } else {
        fh_down(E, i, x);
    }
    return 0;
}

static void fh_remove(engine *E, i64 i) {
    E->f_hpos[E->fh[i].f] = -1;
    fin_entry last = E->fh[--E->nfh];
    if (i == E->nfh) return;
    if (i > 0 && fin_less(&last, &E->fh[(i - 1) / 2]))
        fh_up(E, i, last);
    else
        fh_down(E, i, last);
}

static int update_rates(engine *E) {
    if (component(E)) return -1;
    E->ndirty = 0;
    E->epoch++; /* the dirty marks are stale from here */
    if (E->ncomp) {
        if (fill(E, E->comp, E->ncomp)) return -1;
        double now = E->now;
        for (i64 a = 0; a < E->ncomp; a++) {
            i64 f = E->comp[a];
            double r = E->c_rate[a], old = E->f_rate[f];
            if (r == old) continue;
            if (old > 0.0) E->f_rem[f] -= old * (now - E->f_tlast[f]);
            E->f_tlast[f] = now;
            E->f_rate[f] = r;
            if (r > 0.0) {
                double left = E->f_rem[f];
                fin_entry x = {now + left / r, now + (left - (REL_EPS * E->f_size[f] + 1e-6)) / r, f};
                if (fh_set(E, x)) return -1;
            } else if (E->f_hpos[f] >= 0) {
                fh_remove(E, E->f_hpos[f]);
            }
        }
    }
    E->A->recomputes++;
    E->changed = 0;
    return 0;
}

static double next_drain(engine *E) { return E->nfh > 0 ? E->fh[0].end : INFINITY; }

static void transfer_drained(engine *E, i64 xi, double now) {
    const fe_args *A = E->A;
    i64 g = E->x_send[xi], r = E->step_rank[g];
    complete(E, r, g, now);
    push_event(E, now + A->r_lat[E->x_route[xi]], EV_ARRIVAL, xi, 0);
    release(E, E->send_conn[g], now);
    if (E->n_ready[r]) advance(E, r, now);
}

static int cmp_i64(const void *a, const void *b) {
    i64 x = *(const i64 *)a, y = *(const i64 *)b;
    return (x > y) - (x < y);
}

static int drain_until(engine *E, double t_next, i64 **fin, i64 *fin_cap) {
    const fe_args *A = E->A;
    E->now = t_next;
    double now = t_next;
    i64 nfin = 0;
    while (E->nfh > 0 && E->fh[0].within <= now) {
        i64 f = E->fh[0].f;
        fh_remove(E, 0);
        if (GROW(*fin, *fin_cap, nfin + 1)) return -1;
        (*fin)[nfin++] = f;
    }
    if (!nfin) return 0;
    qsort(*fin, (size_t)nfin, sizeof(i64), cmp_i64);
    E->changed = 1;
    for (i64 a = 0; a < nfin; a++) {
        i64 f = (*fin)[a], s = E->f_sub[f];
        E->f_rem[f] = 0.0;
        const i64 *ls = A->s_links + A->s_link_ptr[s];
        i64 nl = A->s_link_ptr[s + 1] - A->s_link_ptr[s];
        for (i64 j = 0; j < nl; j++) {
            i64 inc = E->f_inc[f] + j;
            if (E->inc_pos[inc] >= 0) on_link_remove(E, ls[j], inc);
            mark_dirty(E, ls[j]);
        }
    }
    for (i64 a = 0; a < nfin; a++) {
        i64 xi = E->f_xfer[(*fin)[a]];
        if (--E->x_pending[xi] == 0) transfer_drained(E, xi, now);
        if (E->oom) return -1;
    }
    return 0;
}

static void pop_due_events(engine *E) {
    const fe_args *A = E->A;
    double now = E->now;
    double until = now + (now * REL_EPS + 1e-15);
    while (E->nev > 0 && E->ev[0].t <= until && !E->oom) {
        event x = E->ev[0];
        event_pop(E->ev, &E->nev);
        if (x.kind == EV_ISSUE) {
            next_issue(E, x.a);
            i64 g = A->step_off[x.a] + x.b;
            if (A->kind[g] == K_SEND)
                start_send(E, x.a, x.b, now);
            else
                post_recv(E, x.a, x.b, now);
            if (E->n_ready[x.a]) advance(E, x.a, now);
        } else if (x.kind == EV_ARRIVAL) {
            deliver(E, E->send_recv[E->x_send[x.a]], now);
        } else {
            complete(E, x.a, A->step_off[x.a] + x.b, now);
            if (E->n_ready[x.a]) advance(E, x.a, now);
        }
    }
}

/* ------------------------------------------------------------------ setup and results */
typedef struct {
    i64 lane, i;
} lane_step;

static int cmp_lane_step(const void *a, const void *b) {
    const lane_step *x = a, *y = b;
    if (x->lane != y->lane) return (x->lane > y->lane) - (x->lane < y->lane);
    return (x->i > y->i) - (x->i < y->i);
}

static int setup_streams(engine *E) {
    const fe_args *A = E->A;
    i64 P = A->nranks, S = A->nsteps;
    E->q_off = malloc((P + 1) * sizeof(i64));
    E->q_ptr = malloc((S + P + 1) * sizeof(i64));
    E->q_steps = malloc((S + 1) * sizeof(i64));
    lane_step *tmp = malloc((S + 1) * sizeof(lane_step));
    if (!E->q_off || !E->q_ptr || !E->q_steps || !tmp) {
        free(tmp);
        return -1;
    }
    i64 nq = 0, p = 0;
    E->q_ptr[0] = 0;
    for (i64 r = 0; r < P; r++) {
        E->q_off[r] = nq;
        i64 o = A->step_off[r], n = A->step_off[r + 1] - o;
        if (!A->lanes) {
            for (i64 i = 0; i < n; i++) E->q_steps[p++] = i;
            E->q_ptr[++nq] = p;
            continue;
        }
        for (i64 i = 0; i < n; i++) tmp[i] = (lane_step){A->lane[o + i], i};
        qsort(tmp, (size_t)n, sizeof(lane_step), cmp_lane_step);
        for (i64 i = 0; i < n; i++) {
            if (i > 0 && tmp[i].lane != tmp[i - 1].lane) E->q_ptr[++nq] = p;
            E->q_steps[p++] = tmp[i].i;
        }
        if (n > 0) E->q_ptr[++nq] = p;
    }
    E->q_off[P] = nq;
    free(tmp);
    E->q_pos = calloc(nq + 1, sizeof(i64));
    E->q_ready = malloc(nq + 1);
    E->blocked_next = malloc((nq + 1) * sizeof(i64));
    E->n_ready = malloc((P + 1) * sizeof(i64));
    if (!E->q_pos || !E->q_ready || !E->blocked_next || !E->n_ready) return -1;
    for (i64 q = 0; q < nq; q++) E->q_ready[q] = 1;
    for (i64 r = 0; r < P; r++) E->n_ready[r] = E->q_off[r + 1] - E->q_off[r];
    return 0;
}

/* per receive step, k for its k-th receive of that (sender, chunk); the message map (src, dst, chunk, k) */
static int setup_messages(engine *E) {
    const fe_args *A = E->A;
    hmap seen = {NULL, 0, 0};
    int rc = -1;
    if (hm_init(&seen, 1024) || hm_init(&E->msg, 1024) || hm_init(&E->send_count, 1024) ||
        hm_init(&E->conns, 1024) || hm_init(&E->open_slot, 1024))
        goto out;
    for (i64 r = 0; r < A->nranks; r++)
        for (i64 g = A->step_off[r]; g < A->step_off[r + 1]; g++) {
            if (A->kind[g] != K_RECV) continue;
            i64 *c = hm_ref(&seen, A->peer[g], r, A->chunk[g], 0, 0);
            if (!c) goto out;
            i64 k = (*c)++;
            if (!hm_ref(&E->msg, A->peer[g], r, A->chunk[g], k, g)) goto out;
        }
    rc = 0;
out:
    hm_free(&seen);
    return rc;
}

typedef struct {
    i64 rank;
    double t, b;
} scratch_ev;

/* scratch events by rank, then (time, bytes) as the Python loop sorts them (equal ones hold equal bytes) */
static int cmp_sc(const void *a, const void *b) {
    const scratch_ev *x = a, *y = b;
    if (x->rank != y->rank) return (x->rank > y->rank) - (x->rank < y->rank);
    if (x->t != y->t) return (x->t > y->t) - (x->t < y->t);
    return (x->b > y->b) - (x->b < y->b);
}

static int results(engine *E) {
    fe_args *A = E->A;
    for (i64 r = 0; r < A->nranks; r++) {
        double m = 0.0;
        for (i64 g = A->step_off[r]; g < A->step_off[r + 1]; g++)
            if (g == A->step_off[r] || A->done_t[g] > m) m = A->done_t[g];
        A->finish[r] = m;
        A->peak_scratch[r] = 0.0;
    }
    for (i64 lk = 0; lk < A->nlinks; lk++) A->link_bytes[lk] = 0.0;
    for (i64 f = 0; f < E->nf; f++) {
        i64 s = E->f_sub[f];
        for (i64 j = A->s_link_ptr[s]; j < A->s_link_ptr[s + 1]; j++) A->link_bytes[A->s_links[j]] += E->f_size[f];
    }
    scratch_ev *ev = malloc((E->nsc + 1) * sizeof(scratch_ev));
    if (!ev) return -1;
    for (i64 x = 0; x < E->nsc; x++) ev[x] = (scratch_ev){E->sc_rank[x], E->sc_t[x], E->sc_b[x]};
    qsort(ev, (size_t)E->nsc, sizeof(scratch_ev), cmp_sc);
    double cur = 0.0, peak = 0.0;
    for (i64 x = 0; x < E->nsc; x++) {
        if (x == 0 || ev[x].rank != ev[x - 1].rank) cur = peak = 0.0;
        cur += ev[x].b;
        if (cur > peak) peak = cur;
        A->peak_scratch[ev[x].rank] = peak;
    }
    free(ev);
    A->transfers = E->nx;
    A->subflows = E->nf;
    return 0;
}

static void engine_free(engine *E) {
    void *ps[] = {E->q_off, E->q_ptr, E->q_steps, E->q_pos, E->q_ready, E->n_ready, E->blocked_head,
                  E->blocked_next, E->step_rank, E->iq_t, E->iq_seq, E->iq_step, E->iq_head, E->iq_tail, E->compute_free, E->cpu_free, E->send_recv, E->send_conn, E->send_next,
                  E->posted, E->waiting, E->has_arrived, E->arrived_t, E->held, E->c_exists, E->c_head,
                  E->c_tail, E->c_rank, E->slot_val, E->slot_present, E->sc_rank, E->sc_t, E->sc_b,
                  E->x_send, E->x_pending, E->x_route, E->f_rem, E->f_tlast, E->f_rate, E->f_size,
                  E->f_xfer, E->f_hpos, E->f_sub, E->f_inc, E->inc_pos, E->dirty,
                  E->dirty_mark, E->seen_l, E->seen_f, E->loc, E->route_seen, E->link_seen, E->ev, E->fh,
                  E->comp, E->stack, E->l_ids, E->l_cnt, E->l_uptr, E->l_users, E->l_fill, E->f_lptr,
                  E->f_ll, E->live, E->bott, E->l_rem, E->l_share, E->c_rate, E->c_frozen};
    for (size_t k = 0; k < sizeof(ps) / sizeof(ps[0]); k++) free(ps[k]);
    if (E->on_link) {
        for (i64 lk = 0; lk < E->A->nlinks; lk++) free(E->on_link[lk].f), free(E->on_link[lk].inc);
        free(E->on_link);
    }
    hm_free(&E->msg);
    hm_free(&E->send_count);
    hm_free(&E->conns);
    hm_free(&E->open_slot);
}

/* Run the schedule to its end. Returns 0, or -1 when memory ran out. Steps that never completed keep
 * done_t = NAN (the caller names the first). */
int treecoll_flow_run(fe_args *A) {
    engine E;
    memset(&E, 0, sizeof(E));
    E.A = A;
    i64 S = A->nsteps, P = A->nranks, L = A->nlinks;
    A->n_order = A->transfers = A->subflows = A->recomputes = 0;
    int rc = -1;
    i64 *fin = NULL, fin_cap = 0;
    for (i64 g = 0; g < S; g++) A->done_t[g] = NAN;
    E.blocked_head = malloc((S + 1) * sizeof(i64));
    E.send_recv = malloc((S + 1) * sizeof(i64));
    E.send_conn = malloc((S + 1) * sizeof(i64));
    E.send_next = malloc((S + 1) * sizeof(i64));
    E.held = malloc((S + 1) * sizeof(i64));
    E.posted = calloc(S + 1, 1);
    E.waiting = calloc(S + 1, 1);
    E.has_arrived = calloc(S + 1, 1);
    E.arrived_t = calloc(S + 1, sizeof(double));
    E.compute_free = calloc(P + 1, sizeof(double));
    E.cpu_free = calloc(P + 1, sizeof(double));
    E.on_link = calloc(L + 1, sizeof(link_users));
    E.dirty_mark = calloc(L + 1, sizeof(i64));
    E.seen_l = calloc(L + 1, sizeof(i64));
    E.loc = calloc(L + 1, sizeof(i64));
    E.link_seen = calloc(L + 1, 1);
    E.route_seen = calloc(A->nroutes + 1, 1);
    E.step_rank = malloc((S + 1) * sizeof(i64));
    E.iq_t = malloc((S + 1) * sizeof(double));
    E.iq_seq = malloc((S + 1) * sizeof(i64));
    E.iq_step = malloc((S + 1) * sizeof(i64));
    E.iq_head = calloc(P + 1, sizeof(i64));
    E.iq_tail = calloc(P + 1, sizeof(i64));
    if (!E.blocked_head || !E.send_recv || !E.send_conn || !E.send_next || !E.held || !E.posted || !E.waiting ||
        !E.has_arrived || !E.arrived_t || !E.compute_free || !E.cpu_free || !E.on_link || !E.dirty_mark ||
        !E.seen_l || !E.loc || !E.link_seen || !E.route_seen || !E.step_rank || !E.iq_t || !E.iq_seq || !E.iq_step ||
        !E.iq_head || !E.iq_tail)
        goto out;
    for (i64 r = 0; r < P; r++)
        for (i64 g = A->step_off[r]; g < A->step_off[r + 1]; g++) E.step_rank[g] = r;
    for (i64 g = 0; g < S; g++) E.blocked_head[g] = E.held[g] = E.send_recv[g] = E.send_next[g] = -1;
    E.epoch = 1;
    if (setup_streams(&E) || setup_messages(&E)) goto out;
    for (i64 r = 0; r < P && !E.oom; r++) advance(&E, r, 0.0);
    while (!E.oom) {
        if (E.changed && update_rates(&E)) goto out;
        double td = next_drain(&E), te = E.nev > 0 ? E.ev[0].t : INFINITY;
        double t_next = te < td ? te : td;
        if (t_next == INFINITY) break;
        if (drain_until(&E, t_next, &fin, &fin_cap)) goto out;
        pop_due_events(&E);
    }
    if (E.oom) goto out;
    rc = results(&E);
out:
    free(fin);
    engine_free(&E);
    return rc;
}

/* Max-min rates of nf subflows alone (the engine's filling, for tests): subflow a crosses the links
 * links[ptr[a] .. ptr[a + 1]) (ids < nlinks), cap[link] bytes/s. Returns 0, or < 0 on failure. */
int treecoll_maxmin_fill(i64 nf, const i64 *ptr, const i64 *links, const double *cap, i64 nlinks, double *rate) {
    fe_args A;
    engine E;
    memset(&A, 0, sizeof(A));
    memset(&E, 0, sizeof(E));
    A.s_link_ptr = ptr;
    A.s_links = links;
    A.cap = cap;
    A.nlinks = nlinks;
    E.A = &A;
    E.epoch = 1;
    E.f_sub = malloc((nf + 1) * sizeof(i64));
    E.comp = malloc((nf + 1) * sizeof(i64));
    E.seen_l = calloc(nlinks + 1, sizeof(i64));
    E.loc = calloc(nlinks + 1, sizeof(i64));
    int rc = -1;
    i64 *comp = E.comp;
    if (E.f_sub && comp && E.seen_l && E.loc) {
        for (i64 a = 0; a < nf; a++) E.f_sub[a] = comp[a] = a;
        rc = nf > 0 ? fill(&E, comp, nf) : 0;
        if (rc == 0)
            for (i64 a = 0; a < nf; a++) rate[a] = E.c_rate[a];
    }
    engine_free(&E);
    return rc;
}
