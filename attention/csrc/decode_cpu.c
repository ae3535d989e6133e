/* Fused split-KV decode attention for CPU caches (the 'native' backend).
 *
 * treecoll_decode() computes, for every sequence b and query head of a batch,
 * the attention state (out, lse) of one query against the sequence's first
 * lengths[b] keys (the contract of attention.decode_partial):
 *     s_t = scale * q . k_t,   out = sum_t softmax(s)_t v_t,   lse = log sum_t exp(s_t).
 *
 * Work split.  The keys of each sequence are cut into blocks of `tb` tokens
 * (and, when there are few blocks, the KV heads into slices); one *task* is
 * (sequence, token block, head slice).  The calling thread and threads of a
 * persistent pool (created on first use, kept for the process) take tasks
 * from a shared counter; a task writes its partial state (running max m,
 * running sum l, unnormalised accumulator) into its own slot of a workspace
 * that is allocated once and grown only when a larger call needs it.  After
 * all tasks, the partial states of each (sequence, head) are merged in token
 * order.  The block size depends on the total length only, and head slices
 * do not change any row's arithmetic, so the result is the same, bit for bit,
 * for any thread count and schedule.
 *
 * Inside a task, tokens are walked in tiles of TILE with an online softmax
 * (natural exp).  K/V elements (float32, bfloat16 or float16) are converted
 * to float32 in registers inside the dot products and the value
 * accumulation: each element is read from memory once and nothing but the
 * small state is written.  bfloat16 is converted by bit operations (a
 * 32-element load gives the even elements by a shift and the odd ones by a
 * mask); the query and the accumulators are kept in the same even/odd order,
 * so no shuffle is needed.  All arithmetic is float32, except with
 * FLAG_FAST_BF16 (bf16 caches on AVX-512 BF16 CPUs), where vdpbf16ps (pairs of
 * bf16 products summed into float32) does the multiplications on the raw bf16
 * keys and values, as GPU kernels do with their bf16 matrix units: the scores
 * with the query rounded to bfloat16, the values with the softmax weights
 * rounded to bfloat16 (the running max and sum stay float32).  Each rounding
 * is a relative error of at most 2^-8 per factor; the multiplications take
 * half the instructions.
 *
 * Instruction sets, chosen once per process from the CPU (and capped by the
 * caller's `isa`): AVX-512 with BF16 (F, BW, VL, DQ + vdpbf16ps), AVX-512
 * (F, BW, VL, DQ), AVX2 (+FMA, F16C) and portable C; the last two share one
 * source that the compiler vectorises for each target.  All give the same
 * results up to float32 rounding.
 *
 * FLAG_STREAM_ONLY (a benchmark's probe, AVX-512 tiers): the same tasks, reads and prefetches
 * without the arithmetic; the output is that of no keys.
 *
 * FLAG_HUGE_PAGES (the caller's word that K and V lie in 2 MiB pages, as
 * attention/kv_cache.py's alloc_kv gives them): the page walks ahead of the prefetches
 * (touch_pages) step by 2 MiB instead of 4 KiB.
 *
 * NaN/inf: plain IEEE arithmetic with one guard (the policy of
 * attention/state.py, as torch's SDPA math path): the shift of the online
 * softmax is the running max, or 0 while it is -inf; a NaN or +inf score
 * makes the row NaN, a -inf score is a weight of exactly 0, NaN/inf in V
 * reach their column.  Positions at or past lengths[b] are never read.
 *
 * Layouts.  q: [batch, q_heads, head_dim] with element strides; K/V: token t
 * of sequence b, head h, element d at byte offset
 *     b * k_b + t * k_t + h * k_h + d * itemsize          (contiguous or strided), or
 *     pages[b * pages_b + t / page_size] * k_b + (t % page_size) * k_t + h * k_h + ...  (paged);
 * out [batch, q_heads, head_dim] and lse [batch, q_heads] float32 with element
 * strides.  Query head h * group + g reads KV head h (GQA).
 * Returns 0, -1 for an unknown dtype, -2 when memory is unavailable, -3 for
 * bad sizes.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };
enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512BF16 = 3 };
enum { FLAG_FAST_BF16 = 1, FLAG_STREAM_ONLY = 2, FLAG_HUGE_PAGES = 4 };
/* Element order of qf and the accumulators within each CHUNK (see chunk_dim). */
enum { PERM_NATURAL = 0, PERM_EVEN_ODD = 1, PERM_UNPACK = 2 };
#define TILE 32        /* tokens per online-softmax step (at most, see task512_dt) */
#define CHUNK 32       /* head_dim elements per load group (padding unit of the buffers) */
#define MAX_THREADS 64

typedef struct {
    const void *q;
    int64_t q_dtype, q_b, q_h, q_d;
    const void *k, *v;
    int64_t kv_dtype, batch, kv_heads, group, head_dim;
    int64_t k_b, k_t, k_h, v_b, v_t, v_h;
    const int64_t *lengths;
    const int64_t *pages;
    int64_t pages_b, page_size;
    float *out;
    int64_t out_b, out_h, out_d;
    float *lse;
    int64_t lse_b, lse_h;
    double scale;
    int64_t threads, isa, flags, block_tokens;
} treecoll_decode_args;

/* ------------------------------------------------------------ conversions */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (e == 0x1fu) {
        u = sign | 0x7f800000u | (mant << 13); /* inf, nan */
    } else if (e != 0) {
        u = sign | ((e + 112u) << 23) | (mant << 13);
    } else { /* zero or subnormal: mant * 2^-24 */
        float f = (float)mant * 5.9604644775390625e-8f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float load_elem(const char *p, int dt) {
    uint16_t h;
    if (dt == DT_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    memcpy(&h, p, 2);
    return dt == DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

static inline int64_t itemsize_of(int64_t dt) { return dt == DT_F32 ? 4 : 2; }

/* Byte address of token t's row (head 0) of sequence b in a K or V cache. */
static inline const char *token_row(const char *base, int64_t b, int64_t t, int64_t stride_b, int64_t stride_t,
                                    const int64_t *pages, int64_t pages_b, int64_t page_size) {
    if (!pages) return base + b * stride_b + t * stride_t;
    return base + pages[b * pages_b + t / page_size] * stride_b + (t % page_size) * stride_t;
}

/* ------------------------------------------------------------ one call */

typedef struct call call_t;
/* Task `id` (-1: none left): sequence b, tokens [t0, t1), KV heads [h0, h1). */
typedef struct {
    int64_t id, b, t0, t1, h0, h1;
} task_t;
/* Runs task *cur into its slot.  A task function may claim the worker's next task early
 * (claim_task into *next, e.g. to prefetch its first tile); run_tasks claims it otherwise
 * (next->id is TASK_UNCLAIMED then). */
typedef void (*task_fn)(const call_t *c, const task_t *cur, task_t *next, float *slot, float *scratch);
#define TASK_UNCLAIMED (-2)

struct call {
    const treecoll_decode_args *a;
    int64_t H, G, D, Dp, Hs, slices, tb, tl, ntasks, slot_floats, scratch_floats;
    int64_t *task_off;  /* [batch + 1]: first task of each sequence */
    float *qf;          /* [batch, q_heads, Dp] scaled query, float32, in the kernel's element order */
    uint16_t *qbf;      /* [batch, q_heads, Dp] scaled query rounded to bf16 (FLAG_FAST_BF16), natural order */
    float *slots;       /* [ntasks, slot_floats] */
    float *scratch;     /* [threads, scratch_floats] */
    task_fn task;
    int perm;           /* order of qf and the accumulators per CHUNK: PERM_* (chunk_dim) */
    atomic_llong next;
};

/* The next task of the shared counter into *t (t->id = -1 when none is left).  The counter's
 * even claims take the tasks of the first half in order and its odd claims those of the second
 * half, so that two threads read far-apart parts of the caches rather than neighbouring blocks
 * (measured on a Zen 4 VM, 2 threads, 128k tokens: 3% faster for bf16 at batch 8, about 2% for
 * fp32 and 0-2% for bf16 at batch 1).
 * Each task still writes its own slot and the merge runs in token order, so the result does
 * not depend on this order. */
static void claim_task(const call_t *c, task_t *t) {
    const treecoll_decode_args *a = c->a;
    const int64_t k = atomic_fetch_add(&((call_t *)c)->next, 1); /* c points to a non-const call_t */
    t->id = -1;
    if (k >= c->ntasks) return;
    const int64_t id = k % 2 == 0 ? k / 2 : (c->ntasks + 1) / 2 + k / 2;
    int64_t lo = 0, hi = a->batch; /* sequence b: task_off[b] <= id < task_off[b + 1] */
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (c->task_off[mid] <= id) lo = mid;
        else hi = mid;
    }
    const int64_t b = lo, rem = id - c->task_off[b], blk = rem / c->slices, sl = rem % c->slices;
    const int64_t len = a->lengths[b];
    t->id = id, t->b = b;
    t->t0 = blk * c->tb, t->t1 = t->t0 + c->tb < len ? t->t0 + c->tb : len;
    t->h0 = sl * c->Hs, t->h1 = t->h0 + c->Hs < c->H ? t->h0 + c->Hs : c->H;
}

/* A task's slot: m [Hs*G], l [Hs*G], acc [Hs*G][Dp]. */
static inline float *slot_m(const call_t *c, const float *slot) { (void)c; return (float *)slot; }
static inline float *slot_l(const call_t *c, const float *slot) { return (float *)slot + c->Hs * c->G; }
static inline float *slot_acc(const call_t *c, const float *slot) { return (float *)slot + 2 * c->Hs * c->G; }

/* Online-softmax step of one query over n scores sg[0..n): p = exp(s - shift) in
 * place (shift = the new running max, or 0 while it is -inf); returns the factor
 * the accumulator must be scaled by, and updates m and l. */
static inline float softmax_step_scalar(float *sg, int64_t n, float *m, float *l) {
    float mx = *m;
    for (int64_t i = 0; i < n; i++) mx = sg[i] > mx ? sg[i] : mx;
    const float shift = mx == -INFINITY ? 0.0f : mx;
    const float alpha = expf(*m - shift); /* 0 when *m = -inf */
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        sg[i] = expf(sg[i] - shift);
        sum += sg[i];
    }
    *l = *l * alpha + sum;
    *m = mx;
    return alpha;
}

/* ------------------------------------------------------------ portable / AVX2 */
/* Written for the auto-vectoriser: the score loop runs over tokens (the K tile is
 * converted and transposed into scratch), the value loop over head_dim. */

static inline __attribute__((always_inline)) void task_generic(const call_t *c, int64_t b, int64_t t0, int64_t t1,
                                                               int64_t h0, int64_t h1, float *slot, float *scratch) {
    const treecoll_decode_args *a = c->a;
    const int dt = (int)a->kv_dtype;
    const int64_t G = c->G, D = c->D, Dp = c->Dp, isz = itemsize_of(dt);
    float *kt = scratch;              /* [D][TILE] */
    float *sc = kt + D * TILE;        /* [G][TILE] */
    float *row = sc + G * TILE;       /* [Dp] */
    float *ms = slot_m(c, slot), *ls = slot_l(c, slot), *accs = slot_acc(c, slot);
    for (int64_t s = t0; s < t1; s += TILE) {
        const int64_t n = t1 - s < TILE ? t1 - s : TILE;
        for (int64_t h = h0; h < h1; h++) {
            const int64_t j = (h - h0) * G;
            for (int64_t i = 0; i < n; i++) {
                const char *kr = token_row(a->k, b, s + i, a->k_b, a->k_t, a->pages, a->pages_b, a->page_size) +
                                 h * a->k_h;
                for (int64_t d = 0; d < D; d++) kt[d * TILE + i] = load_elem(kr + d * isz, dt);
            }
            for (int64_t g = 0; g < G; g++) {
                const float *qg = c->qf + ((b * c->H + h) * G + g) * Dp;
                float *sg = sc + g * TILE;
                for (int64_t i = 0; i < n; i++) sg[i] = 0.0f;
                for (int64_t d = 0; d < D; d++) {
                    const float qd = qg[d];
                    const float *kd = kt + d * TILE;
                    for (int64_t i = 0; i < n; i++) sg[i] += qd * kd[i];
                }
                const float alpha = softmax_step_scalar(sg, n, ms + j + g, ls + j + g);
                float *ag = accs + (j + g) * Dp;
                if (alpha != 1.0f)
                    for (int64_t d = 0; d < D; d++) ag[d] *= alpha;
            }
            for (int64_t i = 0; i < n; i++) {
                const char *vr = token_row(a->v, b, s + i, a->v_b, a->v_t, a->pages, a->pages_b, a->page_size) +
                                 h * a->v_h;
                for (int64_t d = 0; d < D; d++) row[d] = load_elem(vr + d * isz, dt);
                for (int64_t g = 0; g < G; g++) {
                    const float p = sc[g * TILE + i];
                    float *ag = accs + (j + g) * Dp;
                    for (int64_t d = 0; d < D; d++) ag[d] += p * row[d];
                }
            }
        }
    }
}

static void task_portable(const call_t *c, const task_t *cur, task_t *next, float *slot, float *scratch) {
    (void)next;
    task_generic(c, cur->b, cur->t0, cur->t1, cur->h0, cur->h1, slot, scratch);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(TREECOLL_PORTABLE_ONLY)
#define HAVE_X86 1
__attribute__((target("avx2,fma,f16c"))) static void task_avx2(const call_t *c, const task_t *cur, task_t *next,
                                                               float *slot, float *scratch) {
    (void)next;
    task_generic(c, cur->b, cur->t0, cur->t1, cur->h0, cur->h1, slot, scratch);
}

/* ------------------------------------------------------------ AVX-512 */
#include <immintrin.h>
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define T512BF __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define INL inline __attribute__((always_inline))
/* Fully unrolled small loops keep the accumulator arrays in registers. */
#define UNROLL _Pragma("GCC unroll 16")

/* exp(x) for float32 lanes: x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor
 * polynomial (truncation < 6e-9 relative), scaled by 2^n (gradual underflow
 * down to x = -103.9; exactly 0 below, -inf included).  NaN stays NaN: maxps
 * and minps return their second operand when either is NaN.  Arguments are
 * s - shift <= 0 (or NaN), so the upper clamp never bites. */
T512 static INL __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-103.9f);
    const __mmask16 live = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ); /* x >= lo or NaN */
    x = _mm512_min_ps(_mm512_set1_ps(88.7f), _mm512_max_ps(lo, x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(live, p, n);
}

/* The online-softmax step of softmax_step_scalar for the G rows of one KV head, in
 * vectors: row g's scores sc[g * TILE + i], i < n, become p = exp(s - shift) in place;
 * alpha[g] = exp(m_old - shift) is the factor its accumulator must be scaled by (exactly 1
 * when the running max did not move); the row's running sum is kept as 16 partial sums
 * lv[g * 16 ..] (scaled by alpha, reduced when the task ends), its running max m[g] (both
 * float32, as the scalar step).  Written without branches on the data, in three passes
 * (the rows' maxima, the factors of 16 rows per vector, the weights), so that the rows'
 * exp chains overlap. */
T512 static INL void softmax_rows512(float *sc, int64_t G, int64_t n, float *m, float *lv, float *alpha) {
    for (int64_t g = 0; g < G; g++) { /* the new maxima, into alpha for now */
        const float *sg = sc + g * TILE;
        __m512 vmx = _mm512_set1_ps(m[g]);
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffffu : (__mmask16)((1u << (n - i)) - 1u);
            vmx = _mm512_mask_max_ps(vmx, mk, vmx, _mm512_maskz_loadu_ps(mk, sg + i));
        }
        alpha[g] = _mm512_reduce_max_ps(vmx);
    }
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t g = 0; g < G; g += 16) { /* the factors, 16 rows at a time */
        const __mmask16 rk = G - g >= 16 ? (__mmask16)0xffffu : (__mmask16)((1u << (G - g)) - 1u);
        const __m512 old = _mm512_maskz_loadu_ps(rk, m + g), mx = _mm512_maskz_loadu_ps(rk, alpha + g);
        const __m512 shift = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mx, ninf, _CMP_NEQ_UQ), mx); /* 0 while -inf */
        const __mmask16 moved = _mm512_cmp_ps_mask(mx, old, _CMP_NEQ_UQ); /* exp: 0 when m_old = -inf; NaN stays */
        const __m512 va = _mm512_mask_blend_ps(moved, _mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(old, shift)));
        _mm512_mask_storeu_ps(m + g, rk, mx);
        _mm512_mask_storeu_ps(alpha + g, rk, va);
    }
    for (int64_t g = 0; g < G; g++) { /* the weights and the running sums */
        float *sg = sc + g * TILE;
        const __m512 vs = _mm512_set1_ps(m[g] == -INFINITY ? 0.0f : m[g]);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffffu : (__mmask16)((1u << (n - i)) - 1u);
            const __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, sg + i), vs));
            _mm512_mask_storeu_ps(sg + i, mk, p);
            sum = _mm512_mask_add_ps(sum, mk, sum, p);
        }
        _mm512_storeu_ps(lv + g * 16, _mm512_fmadd_ps(_mm512_loadu_ps(lv + g * 16), _mm512_set1_ps(alpha[g]), sum));
    }
}

/* 32 elements of a K/V row (fewer under mask mk: bit i = element i) as two float32
 * vectors: bf16 -> [even elements], [odd elements]; fp16 and fp32 -> [0..15], [16..31]. */
T512 static INL void load32(const char *p, const int dt, __mmask32 mk, __m512 *x0, __m512 *x1) {
    if (dt == DT_BF16) {
        const __m512i raw = _mm512_maskz_loadu_epi16(mk, p);
        *x0 = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
        *x1 = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32((int)0xffff0000u)));
    } else if (dt == DT_F16) {
        *x0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)mk, p));
        *x1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)(mk >> 16), p + 32));
    } else {
        *x0 = _mm512_maskz_loadu_ps((__mmask16)mk, p);
        *x1 = _mm512_maskz_loadu_ps((__mmask16)(mk >> 16), p + 64);
    }
}

/* Software prefetch of a list of byte ranges (row[i] + off, span bytes), i < n, one
 * cache line at a time: pf_lines issues the next `lines` of them, so that a tile's
 * prefetches are spread over the work of the tile before.  Ranges that continue one
 * another (consecutive tokens of a contiguous cache, all heads of their rows) are walked
 * as one, so the common case costs a prefetch and an add per line. */
typedef struct {
    const char *const *row;
    int64_t n, off, span, i;
    uintptr_t at, end; /* the next line to prefetch and the end of the current run of ranges */
} pf_cursor;

static inline void pf_start(pf_cursor *c, const char *const *row, int64_t n, int64_t off, int64_t span) {
    c->row = row, c->n = n, c->off = off, c->span = span, c->i = 0, c->at = c->end = 0;
}

/* The next run of ranges (row[i] + off onwards while each starts where the last ends). */
static inline int pf_next_run(pf_cursor *c) {
    if (c->i >= c->n) return 0;
    const uintptr_t first = (uintptr_t)(c->row[c->i] + c->off);
    c->at = first & ~(uintptr_t)63;
    c->end = first + (uintptr_t)c->span;
    for (c->i++; c->i < c->n && (uintptr_t)(c->row[c->i] + c->off) == c->end; c->i++) c->end += (uintptr_t)c->span;
    return 1;
}

T512 static INL void pf_lines(pf_cursor *c, int64_t lines) {
    while (lines > 0) {
        if (c->at >= c->end && !pf_next_run(c)) return;
        uintptr_t at = c->at;
        const uintptr_t stop = at + (uintptr_t)lines * 64 < c->end ? at + (uintptr_t)lines * 64 : c->end;
        for (; at < stop; at += 64, lines--) _mm_prefetch((const char *)at, _MM_HINT_T1);
        c->at = at;
    }
}

/* Lines of the ranges still to prefetch (an upper bound: one per 64 bytes, plus one per range). */
static inline int64_t pf_left(const pf_cursor *c) { return (c->n - c->i) * (c->span / 64 + 2); }

/* The K and V prefetches of the next tile, issued together: k_per lines of k and v_per lines of v
 * per step of the score and the value loops, so that both are spread evenly over the tile's work.
 * (Measured on the Sapphire Rapids guest of docs/benchmarks.md, 2 threads, 128k tokens, a cache in
 * 2 MiB pages, side by side against prefetching K during the score loop and V during the value
 * loop: 1.03-1.05x faster for bf16 at B = 1, 1.03x at B = 8, 1.10x for fp32 at B = 1.) */
typedef struct {
    pf_cursor *k, *v;
    int64_t k_per, v_per;
} pf_pair;

T512 static INL void pf_step(pf_pair *pp, int64_t steps) {
    pf_lines(pp->k, pp->k_per * steps);
    pf_lines(pp->v, pp->v_per * steps);
}

/* Sums of 16 vectors: lane j of the result is the sum of the lanes of v[j]. */
T512 static INL __m512 reduce16(const __m512 v[16]) {
    __m512 a[8], b[4], d[2];
    UNROLL
    for (int j = 0; j < 8; j++)
        a[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]), _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
    UNROLL
    for (int j = 0; j < 4; j++) {
        const __m512d x = _mm512_castps_pd(a[2 * j]), y = _mm512_castps_pd(a[2 * j + 1]);
        b[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    } /* b[j]: each 128-bit lane holds partial sums of v[4j .. 4j+3] */
    UNROLL
    for (int j = 0; j < 2; j++)
        d[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88), _mm512_shuffle_f32x4(d[0], d[1], 0xdd));
}

/* Lane g * TB + t of r (the score of query g, token t) to sc[g * TILE + t], t < tn, g < gn:
 * one masked store per query, at a base shifted so that its lanes land in place. */
T512 static INL void store_scores(__m512 r, int TB, int64_t tn, int64_t gn, float *sc) {
    const __mmask16 tmask = (__mmask16)((1u << tn) - 1u);
    for (int64_t g = 0; g < gn; g++) _mm512_mask_storeu_ps(sc + g * (TILE - TB), (__mmask16)(tmask << (g * TB)), r);
}

static inline __mmask32 chunk_mask(int64_t c, int64_t nch, int64_t D) {
    const int64_t rem = D - c * CHUNK;
    return (c < nch - 1 || rem >= CHUNK) ? (__mmask32)0xffffffffu : (__mmask32)((1u << rem) - 1u);
}

/* Scores of GB queries (q rows qr, float32 in load32's order) against TB = 16 / GB
 * tokens (rows kr), head_dim in nch chunks: sc[g * TILE + t] (t < tn, g < gn). */
T512 static INL void scores_f32(const int dt, const int GB, const char *const *kr, const float *const *qr, int64_t nch,
                                 int64_t D, int64_t tn, int64_t gn, float *sc) {
    const int TB = 16 / GB;
    const int64_t isz = itemsize_of(dt);
    __m512 acc[16];
    UNROLL
    for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nch; c++) {
        const __mmask32 mk = chunk_mask(c, nch, D);
        __m512 k0[16], k1[16];
        UNROLL
        for (int t = 0; t < TB; t++) load32(kr[t] + c * CHUNK * isz, dt, mk, &k0[t], &k1[t]);
        UNROLL
        for (int g = 0; g < GB; g++) {
            const __m512 q0 = _mm512_loadu_ps(qr[g] + c * CHUNK), q1 = _mm512_loadu_ps(qr[g] + c * CHUNK + 16);
            UNROLL
            for (int t = 0; t < TB; t++) {
                acc[g * TB + t] = _mm512_fmadd_ps(q0, k0[t], acc[g * TB + t]);
                acc[g * TB + t] = _mm512_fmadd_ps(q1, k1[t], acc[g * TB + t]);
            }
        }
    }
    store_scores(reduce16(acc), TB, tn, gn, sc);
}

/* Scores with vdpbf16ps: bf16 keys as they are, the query rounded to bf16 (natural order). */
T512BF static INL void scores_dpbf16(const int GB, const char *const *kr, const uint16_t *const *qr, int64_t nch,
                                     int64_t D, int64_t tn, int64_t gn, float *sc) {
    const int TB = 16 / GB;
    __m512 acc[16];
    UNROLL
    for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nch; c++) {
        const __mmask32 mk = chunk_mask(c, nch, D);
        __m512i kk[16];
        UNROLL
        for (int t = 0; t < TB; t++) kk[t] = _mm512_maskz_loadu_epi16(mk, kr[t] + c * CHUNK * 2);
        UNROLL
        for (int g = 0; g < GB; g++) {
            const __m512bh qq = (__m512bh)_mm512_loadu_si512(qr[g] + c * CHUNK);
            UNROLL
            for (int t = 0; t < TB; t++) acc[g * TB + t] = _mm512_dpbf16_ps(acc[g * TB + t], qq, (__m512bh)kk[t]);
        }
    }
    store_scores(reduce16(acc), TB, tn, gn, sc);
}

/* The scores of GB query rows qr (float32 in load32's order, or bf16 for dot_bf16) against the
 * n tokens of a tile, TB = 16 / GB at a time (rows[i] + hoff: token i's key row) into
 * sc[g * TILE + i]; pf_steps steps of the prefetches pf per TB tokens. */
T512BF static INL void scores_tile(const int dt, const int dot_bf16, const int GB, const char *const *rows, int64_t hoff,
                                   int64_t n, const void *const *qr, int64_t nch, int64_t D, float *sc, pf_pair *pf,
                                   int64_t pf_steps) {
    const int TB = 16 / GB;
    for (int64_t i = 0; i < n; i += TB) {
        const int64_t tn = n - i < TB ? n - i : TB;
        const char *kr[16];
        UNROLL
        for (int t = 0; t < TB; t++) kr[t] = rows[i + (t < tn ? t : 0)] + hoff;
        pf_step(pf, pf_steps);
        if (dot_bf16 && D == 128) /* the common head_dim with its chunk loop unrolled */
            scores_dpbf16(GB, kr, (const uint16_t *const *)qr, 4, 128, tn, GB, sc + i);
        else if (dot_bf16)
            scores_dpbf16(GB, kr, (const uint16_t *const *)qr, nch, D, tn, GB, sc + i);
        else if (D == 128)
            scores_f32(dt, GB, kr, (const float *const *)qr, 4, 128, tn, GB, sc + i);
        else
            scores_f32(dt, GB, kr, (const float *const *)qr, nch, D, tn, GB, sc + i);
    }
}

/* The value accumulators of GB queries (query g's at ag + g * Dp) for the CCH chunks of head_dim
 * from chunk c0 (2 vectors per chunk, zero past nch), scaled by the queries' softmax factors
 * al[g], into acc[g * 2 * CCH + j], and the chunks' element masks into mk. */
T512 static INL void acc_load(const int GB, const int CCH, int64_t c0, int64_t nch, int64_t D, float *ag, int64_t Dp,
                              const float *al, __m512 *acc, __mmask32 *mk) {
    UNROLL
    for (int j = 0; j < CCH; j++) mk[j] = c0 + j < nch ? chunk_mask(c0 + j, nch, D) : 0;
    UNROLL
    for (int g = 0; g < GB; g++)
        UNROLL
        for (int j = 0; j < 2 * CCH; j++)
            acc[g * 2 * CCH + j] = _mm512_mul_ps(
                _mm512_set1_ps(al[g]),
                _mm512_maskz_loadu_ps(c0 + j / 2 < nch ? (__mmask16)0xffffu : 0, ag + g * Dp + c0 * CHUNK + 16 * j));
}

/* acc_load's vectors back (the chunks before nch). */
T512 static INL void acc_store(const int GB, const int CCH, int64_t c0, int64_t nch, float *ag, int64_t Dp,
                               const __m512 *acc) {
    UNROLL
    for (int g = 0; g < GB; g++)
        UNROLL
        for (int j = 0; j < 2 * CCH; j++)
            if (c0 + j / 2 < nch) _mm512_storeu_ps(ag + g * Dp + c0 * CHUNK + 16 * j, acc[g * 2 * CCH + j]);
}

/* acc[g] += sum_i p[g * TILE + i] * v_i over the tile for GB queries (accumulator g at
 * ag + g * Dp), CB vectors (CB/2 chunks) of head_dim at a time (GB * CB = 16 accumulators
 * in registers); pf_steps steps of the prefetches pf per token in every pass over the tile
 * (measured on a shared Zen 4 VM, 2 threads, bf16 at 128k tokens, against prefetching in the
 * first pass only: 0.97-1.11x the speed, faster in most of nine side-by-side runs). */
T512 static INL void values_block(const int dt, const int GB, const char *const *vrow, int64_t n, int64_t nch,
                                  int64_t D, const float *p, float *ag, int64_t Dp, const float *al, pf_pair *pf,
                                  int64_t pf_steps) {
    const int CB = 16 / GB, CCH = CB / 2 > 0 ? CB / 2 : 1;
    const int64_t isz = itemsize_of(dt);
    for (int64_t c0 = 0; c0 < nch; c0 += CCH) {
        __m512 acc[16];
        __mmask32 mk[8];
        acc_load(GB, CCH, c0, nch, D, ag, Dp, al, acc, mk);
        for (int64_t i = 0; i < n; i++) {
            pf_step(pf, pf_steps);
            __m512 x[16];
            UNROLL
            for (int j = 0; j < CCH; j++) load32(vrow[i] + (c0 + j) * CHUNK * isz, dt, mk[j], &x[2 * j], &x[2 * j + 1]);
            UNROLL
            for (int g = 0; g < GB; g++) {
                const __m512 pg = _mm512_set1_ps(p[g * TILE + i]);
                UNROLL
                for (int j = 0; j < 2 * CCH; j++) acc[g * 2 * CCH + j] = _mm512_fmadd_ps(pg, x[j], acc[g * 2 * CCH + j]);
            }
        }
        acc_store(GB, CCH, c0, nch, ag, Dp, acc);
    }
}

/* values_block with vdpbf16ps (bf16 caches, FLAG_FAST_BF16): the weights rounded to bf16
 * (pb[g * TILE + i], TILE entries per query, zero from n on), tokens taken two at a time: the rows of
 * tokens i and i + 1 interleaved element by element (vpunpck{l,h}wd) against the pair
 * (p_i, p_i+1) broadcast, so one instruction adds both tokens' terms of 16 elements and
 * the rows need no conversion.  The accumulators are in PERM_UNPACK order. */
T512BF static INL void values_dpbf16(const int GB, const char *const *vrow, int64_t n, int64_t nch, int64_t D,
                                     const uint16_t *pb, float *ag, int64_t Dp, const float *al, pf_pair *pf,
                                     int64_t pf_steps) {
    const int CB = 16 / GB, CCH = CB / 2 > 0 ? CB / 2 : 1;
    for (int64_t c0 = 0; c0 < nch; c0 += CCH) {
        __m512 acc[16];
        __mmask32 mk[8];
        acc_load(GB, CCH, c0, nch, D, ag, Dp, al, acc, mk);
        for (int64_t i = 0; i < n; i += 2) {
            const int64_t i1 = i + 1 < n ? i + 1 : i; /* an odd tail pairs the last row with zeros */
            const __mmask32 m1 = i + 1 < n ? (__mmask32)0xffffffffu : 0;
            pf_step(pf, 2 * pf_steps);
            __m512i x[16];
            UNROLL
            for (int j = 0; j < CCH; j++) {
                const __m512i r0 = _mm512_maskz_loadu_epi16(mk[j], vrow[i] + (c0 + j) * CHUNK * 2);
                const __m512i r1 = _mm512_maskz_loadu_epi16(mk[j] & m1, vrow[i1] + (c0 + j) * CHUNK * 2);
                x[2 * j] = _mm512_unpacklo_epi16(r0, r1);
                x[2 * j + 1] = _mm512_unpackhi_epi16(r0, r1);
            }
            UNROLL
            for (int g = 0; g < GB; g++) {
                uint32_t pair;
                memcpy(&pair, pb + g * TILE + i, sizeof pair);
                const __m512bh pg = (__m512bh)_mm512_set1_epi32((int)pair);
                UNROLL
                for (int j = 0; j < 2 * CCH; j++)
                    acc[g * 2 * CCH + j] = _mm512_dpbf16_ps(acc[g * 2 * CCH + j], pg, (__m512bh)x[j]);
            }
        }
        acc_store(GB, CCH, c0, nch, ag, Dp, acc);
    }
}

/* p[0..n) (float32, n <= TILE) rounded to bf16 into pb[0..TILE), zeros from n on. */
T512BF static INL void weights_bf16(const float *p, int64_t n, uint16_t *pb) {
    UNROLL
    for (int i = 0; i < TILE; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffffu : n > i ? (__mmask16)((1u << (n - i)) - 1u) : 0;
        _mm256_storeu_si256((__m256i *)(pb + i), (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, p + i)));
    }
}

/* One load per page (1 << shift bytes: 4 KiB, or 2 MiB with FLAG_HUGE_PAGES) spanned by
 * heads [h0, h1) of the rows row[0..n): the page walks happen now, so that the software
 * prefetches of these rows (which this CPU may drop on a TLB miss) reach memory.  Each
 * touch is a demand load from memory that the prefetches have not yet asked for.
 * (Measured: with 4 KiB pages, 5-8% faster for bf16 at 128k tokens than no touch.  With a
 * cache in 2 MiB pages, on the Sapphire Rapids guest of docs/benchmarks.md, 128k tokens,
 * 2 threads, side by side: a touch per 2 MiB ran 1.03x (bf16 B = 1), 1.05x (bf16 B = 8) and
 * 1.005x (fp32 B = 1) faster than a touch per 4 KiB, and no touch at all 1.03-1.10x (bf16
 * B = 1) and 1.025x (B = 8); without the touch, tiles of 64 tokens instead of 32 were no
 * faster, tiles of 16 0.96-0.97x; issuing each tile's prefetches in the first half or
 * quarter of the tile before, instead of spread over all of it, 0.975x and 0.90x;
 * prefetching two tiles ahead instead of one 0.955x (B = 1) and 0.93x (B = 8);
 * prefetcht2 instead of prefetcht1 1.01x, prefetcht0 0.92x.) */
static volatile unsigned page_sink;
static inline void touch_pages(const char *const *row, int64_t n, int64_t stride, int64_t h0, int64_t h1,
                               int64_t bytes, int shift) {
    uintptr_t last = 0;
    unsigned acc = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *lo = row[i] + h0 * stride, *hi = row[i] + (h1 - 1) * stride + bytes - 1;
        if ((uintptr_t)lo >> shift != last) acc += *(volatile const unsigned char *)lo;
        if ((uintptr_t)hi >> shift != (uintptr_t)lo >> shift) acc += *(volatile const unsigned char *)hi;
        last = (uintptr_t)hi >> shift;
    }
    page_sink += acc;
}

/* The K and V rows (head 0) of tokens s .. s + n - 1 of sequence b. */
static inline void tile_rows(const call_t *c, int64_t b, int64_t s, int64_t n, const char **kr, const char **vr) {
    const treecoll_decode_args *a = c->a;
    for (int64_t i = 0; i < n; i++) {
        kr[i] = token_row(a->k, b, s + i, a->k_b, a->k_t, a->pages, a->pages_b, a->page_size);
        vr[i] = token_row(a->v, b, s + i, a->v_b, a->v_t, a->pages, a->pages_b, a->page_size);
    }
}

/* Query-group blocks: the largest of 8, 4, 2, 1 that fits the remaining queries. */
static inline int group_block(int64_t rem) { return rem >= 8 ? 8 : rem >= 4 ? 4 : rem >= 2 ? 2 : 1; }

#define DISPATCH_GB(GB, CALL)                                                                                      \
    switch (GB) {                                                                                                  \
    case 8: { const int gb_ = 8; CALL; break; }                                                                    \
    case 4: { const int gb_ = 4; CALL; break; }                                                                    \
    case 2: { const int gb_ = 2; CALL; break; }                                                                    \
    default: { const int gb_ = 1; CALL; break; }                                                                   \
    }

/* FLAG_STREAM_ONLY: the `bytes` bytes at rows[i] + off, i < n, xor-ed into sink by 64-byte loads,
 * with `steps` steps of the prefetches pf every `every` rows (the loads and prefetches of the score
 * pass, or of every pass of the value loops, without their arithmetic). */
static volatile unsigned stream_sink;
T512 static INL __m512i stream_rows(const char *const *rows, int64_t n, int64_t off, int64_t bytes, int64_t every,
                                    pf_pair *pf, int64_t steps, __m512i sink) {
    for (int64_t i = 0; i < n; i++) {
        if (i % every == 0) pf_step(pf, steps);
        for (int64_t o = 0; o < bytes; o += 64) {
            const __mmask64 mk = bytes - o >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (bytes - o)) - 1;
            sink = _mm512_xor_si512(sink, _mm512_maskz_loadu_epi8(mk, rows[i] + off + o));
        }
    }
    return sink;
}

/* One task on the AVX-512 tiers: per tile of c->tl tokens and per KV head, the scores of
 * the head's queries, their online-softmax step and the values.  While the tile is
 * computed, the next tile's K and V rows are prefetched into L2 (prefetcht1), a few
 * lines per step of the score and value loops (pf_cursor): one head's rows are
 * kv_heads * head_dim * itemsize bytes apart, so each 4 KiB page holds few of them and
 * the hardware prefetchers (which stop at page boundaries) fall behind.  When the heads
 * of a token are adjacent in memory (k_h = head_dim * itemsize, the usual layouts), the
 * work of head h prefetches its share of the next tile's tokens, all heads of the slice,
 * in address order; otherwise head h prefetches its own rows of the next tile.  The tile
 * is 32 tokens, or 16 when a token's K and V rows (all heads of the slice) exceed 4 KiB,
 * so that the tile being read and the one being prefetched stay well inside L2.  During
 * a task's last tile the worker claims its next task and prefetches that task's first
 * tile, so only a worker's first tile is read without prefetch.  Per head and tile, the
 * softmax step of the head's query rows runs in vectors (softmax_rows512) and the
 * accumulators' rescale is folded into the value pass that loads them anyway.
 * (Measured on a Zen 4 VM, one thread, 128k tokens, Llama-3.1-8B shapes: without the
 * prefetch bf16 runs about 2x slower; with tiles twice as long fp32 runs 1.3x slower;
 * prefetching into L1 (prefetcht0) instead runs about 1.7x slower, and two tiles ahead instead
 * of one is no faster.  A cache in 2 MiB pages (transparent huge pages, alloc_kv of
 * attention/kv_cache.py) runs about 1.2x faster: this order touches a new 4 KiB page
 * every few rows.  On the Sapphire Rapids guest of docs/benchmarks.md, 2 threads, 128k
 * tokens, the 2 MiB-page rows of tools/bench_decode took 0.97-1.12x the time of its 4 KiB
 * rows, bf16 and fp32.) */
T512BF static INL void task512_dt(const int dt, const int dot_bf16, const int stream_only, const call_t *c,
                                  const task_t *task, task_t *next, float *slot, float *scratch) {
    const treecoll_decode_args *a = c->a;
    const int64_t b = task->b, t0 = task->t0, t1 = task->t1, h0 = task->h0, h1 = task->h1;
    const int64_t G = c->G, D = c->D, Dp = c->Dp, nch = (D + CHUNK - 1) / CHUNK, isz = itemsize_of(dt);
    float *sc = scratch;                              /* [G][TILE] */
    uint16_t *pbf = (uint16_t *)(scratch + G * TILE); /* [G][TILE]: sc rounded to bf16 (dot_bf16) */
    float *alpha = scratch + G * TILE + G * TILE / 2; /* [G]: the softmax factors of a head's rows */
    float *lv = alpha + (G + 15) / 16 * 16;           /* [(h1 - h0) * G][16]: the rows' running sums */
    float *ms = slot_m(c, slot), *ls = slot_l(c, slot), *accs = slot_acc(c, slot);
    memset(lv, 0, (size_t)((h1 - h0) * G * 16) * sizeof(float));
    __m512i sink = _mm512_setzero_si512(); /* FLAG_STREAM_ONLY: the rows' bits, xor-ed */
    const char *krow[2][TILE], *vrow[2][TILE]; /* rows of this tile and of the next */
    const int64_t tl = c->tl; /* tokens per tile, <= TILE */
    int cur = 0;
    tile_rows(c, b, t0, t1 - t0 < tl ? t1 - t0 : tl, krow[0], vrow[0]);
    for (int64_t s = t0; s < t1; s += tl, cur ^= 1) {
        const int64_t n = t1 - s < tl ? t1 - s : tl;
        /* the next tile: pf tokens of sequence pseq from ps, heads [ph0, ph1): this task's, or
         * during its last tile the first tile of the worker's next task (claimed now) */
        int64_t pseq = b, ps = s + n, pf = t1 - s - n < tl ? t1 - s - n : tl, ph0 = h0, ph1 = h1;
        if (pf == 0) {
            claim_task(c, next);
            if (next->id >= 0) {
                pseq = next->b, ps = next->t0, ph0 = next->h0, ph1 = next->h1;
                pf = next->t1 - next->t0 < tl ? next->t1 - next->t0 : tl;
            }
        }
        const char *const *kn = krow[cur ^ 1], *const *vn = vrow[cur ^ 1];
        tile_rows(c, pseq, ps, pf, krow[cur ^ 1], vrow[cur ^ 1]);
        const int adjacent = a->k_h == D * isz && a->v_h == D * isz;
        const int shift = a->flags & FLAG_HUGE_PAGES ? 21 : 12;
        touch_pages(kn, pf, a->k_h, ph0, ph1, D * isz, shift);
        touch_pages(vn, pf, a->v_h, ph0, ph1, D * isz, shift);
        for (int64_t h = h0; h < h1; h++) {
            const int64_t j = (h - h0) * G, nh = h1 - h0, hp = ph0 + (h - h0);
            pf_cursor pk, pv;
            if (adjacent) { /* this head's share of the next tile's rows, all heads of its slice */
                const int64_t lo = (h - h0) * pf / nh, hi = (h - h0 + 1) * pf / nh;
                pf_start(&pk, kn + lo, hi - lo, ph0 * a->k_h, (ph1 - ph0) * D * isz);
                pf_start(&pv, vn + lo, hi - lo, ph0 * a->v_h, (ph1 - ph0) * D * isz);
            } else { /* the rows of one head of the next tile (the head at the same place in its slice) */
                pf_start(&pk, kn, hp < ph1 ? pf : 0, hp * a->k_h, D * isz);
                pf_start(&pv, vn, hp < ph1 ? pf : 0, hp * a->v_h, D * isz);
            }
            /* the steps of the tile's work: one per TB tokens of the score loop, one per token of each
             * pass of the value loops, which walk the tile once per CCH chunks of head_dim */
            const int64_t tb0 = 16 / group_block(G), cch = tb0 / 2 > 0 ? tb0 / 2 : 1, vpasses = (nch + cch - 1) / cch;
            const int64_t steps = (n + tb0 - 1) / tb0 + n * vpasses;
            pf_pair pp = {&pk, &pv, (pf_left(&pk) + steps - 1) / steps, (pf_left(&pv) + steps - 1) / steps};
            if (stream_only) { /* the same reads and prefetches, no arithmetic */
                sink = stream_rows(krow[cur], n, h * a->k_h, D * isz, tb0, &pp, 1, sink);
                sink = stream_rows(vrow[cur], n, h * a->v_h, D * isz, 1, &pp, vpasses, sink);
                pf_lines(&pk, pf_left(&pk));
                pf_lines(&pv, pf_left(&pv));
                continue;
            }
            for (int64_t g0 = 0; g0 < G; g0 += group_block(G - g0)) {
                const int GB = group_block(G - g0);
                const void *qr[8];
                for (int g = 0; g < GB; g++) {
                    const int64_t row = ((b * c->H + h) * G + g0 + g) * Dp;
                    qr[g] = dot_bf16 ? (const void *)(c->qbf + row) : (const void *)(c->qf + row);
                }
                DISPATCH_GB(GB, scores_tile(dt, dot_bf16, gb_, krow[cur], h * a->k_h, n, qr, nch, D,
                                            sc + g0 * TILE, &pp, g0 == 0));
            }
            softmax_rows512(sc, G, n, ms + j, lv + j * 16, alpha); /* the values apply alpha */
            const char *vr[TILE];
            for (int64_t i = 0; i < n; i++) vr[i] = vrow[cur][i] + h * a->v_h;
            if (dot_bf16)
                for (int64_t g = 0; g < G; g++) weights_bf16(sc + g * TILE, n, pbf + g * TILE);
            for (int64_t g0 = 0; g0 < G; g0 += group_block(G - g0)) {
                const int GB = group_block(G - g0);
                const float *p = sc + g0 * TILE;
                const uint16_t *pb = pbf + g0 * TILE;
                float *ag = accs + (j + g0) * Dp;
                const int64_t pvn = g0 == 0;
                if (dot_bf16 && D == 128) /* the common head_dim with its chunk loop unrolled */
                    DISPATCH_GB(GB, values_dpbf16(gb_, vr, n, 4, 128, pb, ag, Dp, alpha + g0, &pp, pvn))
                else if (dot_bf16)
                    DISPATCH_GB(GB, values_dpbf16(gb_, vr, n, nch, D, pb, ag, Dp, alpha + g0, &pp, pvn))
                else if (D == 128)
                    DISPATCH_GB(GB, values_block(dt, gb_, vr, n, 4, 128, p, ag, Dp, alpha + g0, &pp, pvn))
                else
                    DISPATCH_GB(GB, values_block(dt, gb_, vr, n, nch, D, p, ag, Dp, alpha + g0, &pp, pvn))
            }
            pf_lines(&pk, pf_left(&pk));
            pf_lines(&pv, pf_left(&pv));
        }
    }
    for (int64_t r = 0; r < (h1 - h0) * G; r++) ls[r] = _mm512_reduce_add_ps(_mm512_loadu_ps(lv + r * 16));
    if (stream_only) stream_sink += (unsigned)_mm512_reduce_add_epi32(sink);
}

/* The AVX-512 tiers.  Both are compiled with the BF16 target because the score pass
 * may use vdpbf16ps; with DOT = 0 no BF16 instruction is executed (the code uses
 * none outside the dot_bf16 branches), so the plain tier runs on AVX-512 CPUs without BF16.
 * The vdpbf16ps tier exists for bf16 caches only (pick_task). */
T512BF static void task_avx512(const call_t *c, const task_t *cur, task_t *next, float *slot, float *scratch) {
    switch ((int)c->a->kv_dtype) {
    case DT_BF16: task512_dt(DT_BF16, 0, 0, c, cur, next, slot, scratch); break;
    case DT_F16: task512_dt(DT_F16, 0, 0, c, cur, next, slot, scratch); break;
    default: task512_dt(DT_F32, 0, 0, c, cur, next, slot, scratch); break;
    }
}

T512BF static void task_avx512_dot(const call_t *c, const task_t *cur, task_t *next, float *slot, float *scratch) {
    task512_dt(DT_BF16, 1, 0, c, cur, next, slot, scratch);
}

/* FLAG_STREAM_ONLY (a benchmark's probe, not attention): the reads and prefetches of the
 * AVX-512 tier in its task and tile order, without the arithmetic; the states stay empty. */
T512BF static void task_avx512_stream(const call_t *c, const task_t *cur, task_t *next, float *slot, float *scratch) {
    task512_dt((int)c->a->kv_dtype, 0, 1, c, cur, next, slot, scratch);
}
#endif /* x86 */

/* ------------------------------------------------------------ ISA choice */

static int cpu_isa(void) {
#ifdef HAVE_X86
    __builtin_cpu_init();
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (avx512 && __builtin_cpu_supports("avx512bf16")) return ISA_AVX512BF16;
    if (avx512) return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
#endif
    return ISA_PORTABLE;
}

static int chosen_isa = ISA_PORTABLE;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static void choose_isa(void) { chosen_isa = cpu_isa(); }

static int best_isa(void) {
    pthread_once(&isa_once, choose_isa);
    return chosen_isa;
}

static const char *const ISA_NAMES[] = {"portable", "avx2", "avx512", "avx512_bf16"};

/* The instruction set chosen for this CPU (once per process). */
const char *treecoll_decode_isa(void) { return ISA_NAMES[best_isa()]; }

/* ------------------------------------------------------------ thread pool */
/* The caller runs as worker 0; workers 1..T-1 are persistent threads woken by a
 * generation counter.  Calls are serialised by call_lock (which also guards the
 * workspace).  After fork() the child starts with no workers and fresh locks. */

typedef void (*work_fn)(void *arg, int worker);

static struct {
    pthread_mutex_t call_lock, m;
    pthread_cond_t go, done;
    pthread_t th[MAX_THREADS];
    int started, active, finished;
    uint64_t gen, start_gen[MAX_THREADS];
    work_fn fn;
    void *arg;
} pool = {.call_lock = PTHREAD_MUTEX_INITIALIZER, .m = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER,
        .done = PTHREAD_COND_INITIALIZER};

static void *pool_worker(void *p) {
    const int id = (int)(intptr_t)p;
    uint64_t seen = pool.start_gen[id]; /* the generation when this worker was created */
    pthread_mutex_lock(&pool.m);
    for (;;) {
        while (pool.gen == seen) pthread_cond_wait(&pool.go, &pool.m);
        seen = pool.gen;
        if (id >= pool.active) continue;
        work_fn fn = pool.fn;
        void *arg = pool.arg;
        pthread_mutex_unlock(&pool.m);
        fn(arg, id);
        pthread_mutex_lock(&pool.m);
        if (++pool.finished == pool.active - 1) pthread_cond_signal(&pool.done);
    }
    return NULL;
}

static void atfork_prepare(void) { pthread_mutex_lock(&pool.call_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&pool.call_lock); }
static void atfork_child(void) { /* the workers do not exist in the child */
    pthread_mutex_init(&pool.call_lock, NULL);
    pthread_mutex_init(&pool.m, NULL);
    pthread_cond_init(&pool.go, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.started = pool.active = pool.finished = 0;
}
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/* Start workers up to `threads` in all (call_lock held); returns how many threads can
 * run (fewer if the system refuses to create more). */
static int pool_threads(int threads) {
    threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    while (pool.started < threads - 1) {
        pool.start_gen[pool.started + 1] = pool.gen;
        if (pthread_create(&pool.th[pool.started], NULL, pool_worker, (void *)(intptr_t)(pool.started + 1)) != 0) break;
        pthread_detach(pool.th[pool.started]);
        pool.started++;
    }
    return threads > pool.started + 1 ? pool.started + 1 : threads;
}

/* Run fn(arg, i) for i in [0, threads) (i = 0 on the caller); call_lock held and
 * threads <= pool_threads(threads). */
static void pool_run(int threads, work_fn fn, void *arg) {
    if (threads > 1) {
        pthread_mutex_lock(&pool.m);
        pool.fn = fn;
        pool.arg = arg;
        pool.active = threads;
        pool.finished = 0;
        pool.gen++;
        pthread_cond_broadcast(&pool.go);
        pthread_mutex_unlock(&pool.m);
    }
    fn(arg, 0);
    if (threads > 1) {
        pthread_mutex_lock(&pool.m);
        while (pool.finished < threads - 1) pthread_cond_wait(&pool.done, &pool.m);
        pthread_mutex_unlock(&pool.m);
    }
}

/* ------------------------------------------------------------ workspace */
/* Grown, never shrunk; guarded by call_lock. */
static struct {
    void *p[5];
    size_t cap[5];
} ws;

static void *ws_get(int i, size_t bytes) {
    bytes = (bytes + 63) & ~(size_t)63;
    if (bytes == 0) bytes = 64;
    if (ws.cap[i] < bytes) {
        free(ws.p[i]);
        ws.p[i] = aligned_alloc(64, bytes);
        ws.cap[i] = ws.p[i] ? bytes : 0;
    }
    return ws.p[i];
}

/* ------------------------------------------------------------ tasks and the merge */

static void run_tasks(void *arg, int worker) {
    call_t *c = arg;
    float *scratch = c->scratch + (int64_t)worker * c->scratch_floats;
    task_t cur, next;
    claim_task(c, &cur);
    while (cur.id >= 0) {
        float *slot = c->slots + cur.id * c->slot_floats;
        const int64_t rows = (cur.h1 - cur.h0) * c->G;
        for (int64_t r = 0; r < rows; r++) {
            slot_m(c, slot)[r] = -INFINITY;
            slot_l(c, slot)[r] = 0.0f;
        }
        memset(slot_acc(c, slot), 0, (size_t)(rows * c->Dp) * sizeof(float));
        next.id = TASK_UNCLAIMED;
        c->task(c, &cur, &next, slot, scratch);
        if (next.id == TASK_UNCLAIMED) claim_task(c, &next);
        cur = next;
    }
}

/* The element of a CHUNK held at position k (0 .. CHUNK-1) in the kernel's order:
 * PERM_EVEN_ODD (bf16 converted by shift and mask): [even | odd] elements;
 * PERM_UNPACK (values by vdpbf16ps on two rows interleaved by vpunpck{l,h}wd, which
 * work per 128-bit lane): [0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, 20-23, 28-31]. */
static inline int64_t chunk_dim(int perm, int64_t k) {
    const int64_t half = k / (CHUNK / 2), i = k % (CHUNK / 2);
    if (perm == PERM_EVEN_ODD) return 2 * i + half;
    if (perm == PERM_UNPACK) return 8 * (i / 4) + 4 * half + i % 4;
    return k;
}

/* row (Dp floats, kernel order) -> out[d * stride] (natural order, d < D). */
static void write_row(const call_t *c, const float *row, float scale, float *out, int64_t stride) {
    if (c->perm == PERM_NATURAL) {
        for (int64_t d = 0; d < c->D; d++) out[d * stride] = row[d] * scale;
        return;
    }
    for (int64_t base = 0; base < c->D; base += CHUNK)
        for (int64_t k = 0; k < CHUNK; k++) {
            const int64_t d = base + chunk_dim(c->perm, k);
            if (d < c->D) out[d * stride] = row[base + k] * scale;
        }
}

/* out/lse of every (sequence, query head): the blocks' states merged in token order with
 * the policy of attention/state.py (a block of weight 0 still passes NaN/inf of acc). */
static void merge_blocks(const call_t *c, float *row) {
    const treecoll_decode_args *a = c->a;
    const int64_t G = c->G, Dp = c->Dp;
    for (int64_t b = 0; b < a->batch; b++) {
        const int64_t nb = (c->task_off[b + 1] - c->task_off[b]) / c->slices;
        for (int64_t hq = 0; hq < c->H * G; hq++) {
            const int64_t h = hq / G, sl = h / c->Hs, r = (h - sl * c->Hs) * G + hq % G;
            float *out = a->out + b * a->out_b + hq * a->out_h, *lse = a->lse + b * a->lse_b + hq * a->lse_h;
            if (nb == 0) { /* no keys */
                for (int64_t d = 0; d < c->D; d++) out[d * a->out_d] = 0.0f;
                *lse = -INFINITY;
                continue;
            }
            const float *first = c->slots + (c->task_off[b] + sl) * c->slot_floats;
            float mx = slot_m(c, first)[r], den, shift;
            for (int64_t k = 1; k < nb; k++) {
                const float m = slot_m(c, first + k * c->slices * c->slot_floats)[r];
                mx = (m > mx || m != m) ? m : mx;
            }
            shift = mx == -INFINITY ? 0.0f : mx;
            const float *acc = row;
            if (nb == 1) { /* the block's own shift is the max: weight 1 */
                den = slot_l(c, first)[r];
                acc = slot_acc(c, first) + r * Dp;
            } else {
                den = 0.0f;
                for (int64_t d = 0; d < Dp; d++) row[d] = 0.0f;
                for (int64_t k = 0; k < nb; k++) {
                    const float *slot = first + k * c->slices * c->slot_floats, m = slot_m(c, slot)[r];
                    const float w = m == -INFINITY ? 0.0f : expf(m - shift);
                    const float *ak = slot_acc(c, slot) + r * Dp;
                    den += w * slot_l(c, slot)[r];
                    for (int64_t d = 0; d < Dp; d++) row[d] += w * ak[d];
                }
            }
            write_row(c, acc, den == 0.0f ? 1.0f : 1.0f / den, out, a->out_d);
            *lse = shift + logf(den); /* -inf when den = 0 */
        }
    }
}

/* The scaled query of every head in the kernel's element order (zero padded to Dp),
 * and rounded to bf16 in natural order for the vdpbf16ps scores. */
static void prepare_query(const call_t *c, float *tmp) {
    const treecoll_decode_args *a = c->a;
    const int64_t isz = itemsize_of(a->q_dtype), Hq = c->H * c->G, D = c->D, Dp = c->Dp;
    const float scale = (float)a->scale;
    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t hq = 0; hq < Hq; hq++) {
            float *qf = c->qf + (b * Hq + hq) * Dp;
            const char *src = (const char *)a->q + (b * a->q_b + hq * a->q_h) * isz;
            if (a->q_dtype == DT_F32 && a->q_d == 1) {
                const float *qs = (const float *)src;
                for (int64_t d = 0; d < D; d++) tmp[d] = qs[d] * scale;
            } else {
                for (int64_t d = 0; d < D; d++) tmp[d] = load_elem(src + d * a->q_d * isz, (int)a->q_dtype) * scale;
            }
            for (int64_t d = D; d < Dp; d++) tmp[d] = 0.0f;
            if (c->qbf)
                for (int64_t d = 0; d < Dp; d++) c->qbf[(b * Hq + hq) * Dp + d] = f32_to_bf16(tmp[d]);
            for (int64_t base = 0; base < Dp; base += CHUNK)
                for (int64_t k = 0; k < CHUNK; k++) qf[base + k] = tmp[base + chunk_dim(c->perm, k)];
        }
}

static task_fn pick_task(int isa, int dt, int dot, int stream_only) {
#ifdef HAVE_X86
    if (stream_only && isa >= ISA_AVX512) return task_avx512_stream;
    if (isa >= ISA_AVX512BF16 && dot && dt == DT_BF16) return task_avx512_dot;
    if (isa >= ISA_AVX512) return task_avx512;
    if (isa >= ISA_AVX2) return task_avx2;
#endif
    (void)isa, (void)dt, (void)dot, (void)stream_only;
    return task_portable;
}

static int decode_locked(const treecoll_decode_args *a) {
    call_t c;
    memset(&c, 0, sizeof c);
    c.a = a;
    c.H = a->kv_heads;
    c.G = a->group;
    c.D = a->head_dim;
    c.Dp = (c.D + CHUNK - 1) / CHUNK * CHUNK;
    int isa = best_isa();
    if (a->isa >= 0 && a->isa < isa) isa = (int)a->isa;
    const int dt = (int)a->kv_dtype, dot = (a->flags & FLAG_FAST_BF16) && dt == DT_BF16 && isa >= ISA_AVX512BF16;
    c.task = pick_task(isa, dt, dot, (a->flags & FLAG_STREAM_ONLY) != 0);
    c.perm = dot ? PERM_UNPACK : isa >= ISA_AVX512 && dt == DT_BF16 ? PERM_EVEN_ODD : PERM_NATURAL;
    int threads = pool_threads((int)(a->threads > MAX_THREADS ? MAX_THREADS : a->threads));
    int64_t total = 0;
    for (int64_t b = 0; b < a->batch; b++) total += a->lengths[b];
    if (a->block_tokens > 0) {
        c.tb = a->block_tokens;
    } else { /* about 64 blocks in all (whole tiles, 256 .. 16384 tokens): the block size, and so
              * the result, does not depend on the thread count */
        c.tb = (total + 63) / 64;
        c.tb = c.tb < 256 ? 256 : c.tb > 16384 ? 16384 : c.tb;
        c.tb = (c.tb + TILE - 1) / TILE * TILE;
    }
    int64_t nblocks = 0;
    for (int64_t b = 0; b < a->batch; b++) nblocks += (a->lengths[b] + c.tb - 1) / c.tb;
    c.slices = 1; /* few blocks: split the KV heads too, so that every thread has work */
    if (threads > 1 && nblocks > 0 && nblocks < 4 * threads) {
        c.slices = (4 * threads + nblocks - 1) / nblocks;
        c.slices = c.slices > c.H ? c.H : c.slices;
    }
    c.Hs = (c.H + c.slices - 1) / c.slices;
    c.slices = (c.H + c.Hs - 1) / c.Hs;
    c.tl = 2 * c.Hs * c.D * itemsize_of(dt) > 4096 ? TILE / 2 : TILE;
    c.ntasks = nblocks * c.slices;
    c.slot_floats = c.Hs * c.G * (2 + c.Dp);
    /* the larger of task_generic's [D * TILE + G * TILE + Dp] and task512_dt's
     * [G * TILE + G * TILE / 2 + G (rounded to 16) + Hs * G * 16] */
    c.scratch_floats = (c.D * TILE + c.G * TILE + c.G * TILE / 2 + c.Dp + c.G + 16 + c.Hs * c.G * 16 + 15) / 16 * 16;
    if (threads > c.ntasks) threads = (int)(c.ntasks > 0 ? c.ntasks : 1);
    c.task_off = ws_get(0, (size_t)(a->batch + 1) * sizeof(int64_t));
    c.qf = ws_get(1, (size_t)(a->batch * c.H * c.G * c.Dp) * sizeof(float));
    c.qbf = dot ? ws_get(2, (size_t)(a->batch * c.H * c.G * c.Dp) * sizeof(uint16_t)) : NULL;
    c.slots = ws_get(3, (size_t)(c.ntasks * c.slot_floats) * sizeof(float));
    c.scratch = ws_get(4, (size_t)((threads + 1) * c.scratch_floats) * sizeof(float));
    if (!c.task_off || !c.qf || (dot && !c.qbf) || !c.slots || !c.scratch) return -2;
    c.task_off[0] = 0;
    for (int64_t b = 0; b < a->batch; b++)
        c.task_off[b + 1] = c.task_off[b] + (a->lengths[b] + c.tb - 1) / c.tb * c.slices;
    prepare_query(&c, c.scratch + threads * c.scratch_floats);
    atomic_init(&c.next, 0);
    if (c.ntasks > 0) pool_run(threads, run_tasks, &c);
    merge_blocks(&c, c.scratch + threads * c.scratch_floats);
    return 0;
}

int treecoll_decode(const treecoll_decode_args *a) {
    if (a->kv_dtype != DT_F32 && a->kv_dtype != DT_BF16 && a->kv_dtype != DT_F16) return -1;
    if (a->q_dtype != DT_F32 && a->q_dtype != DT_BF16 && a->q_dtype != DT_F16) return -1;
    if (a->batch < 0 || a->kv_heads < 1 || a->group < 1 || a->head_dim < 1) return -3;
    pthread_once(&fork_once, register_atfork);
    pthread_mutex_lock(&pool.call_lock);
    const int rc = decode_locked(a);
    pthread_mutex_unlock(&pool.call_lock);
    return rc;
}

/* ------------------------------------------------------------ read rate */
/* Sum of n float32 (n a multiple of 64, p 64-byte aligned) over `threads` threads of
 * the pool: the read-only memory rate the benchmark compares the kernel with. */

typedef struct {
    const float *p;
    int64_t n;
    int threads;
    double part[MAX_THREADS];
} sum_t;

static void sum_portable(const float *p, int64_t n, double *out) {
    float s[16] = {0};
    for (int64_t i = 0; i < n; i += 16)
        for (int j = 0; j < 16; j++) s[j] += p[i + j];
    double t = 0;
    for (int j = 0; j < 16; j++) t += s[j];
    *out = t;
}

#ifdef HAVE_X86
T512 static void sum_avx512(const float *p, int64_t n, double *out) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = 0; i < n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
    }
    *out = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}
#endif

static void run_sum(void *arg, int worker) {
    sum_t *s = arg;
    const int64_t per = s->n / 64 / s->threads * 64, lo = worker * per, hi = worker == s->threads - 1 ? s->n : lo + per;
#ifdef HAVE_X86
    if (best_isa() >= ISA_AVX512) {
        sum_avx512(s->p + lo, hi - lo, &s->part[worker]);
        return;
    }
#endif
    sum_portable(s->p + lo, hi - lo, &s->part[worker]);
}

double treecoll_read_sum(const float *p, int64_t n, int64_t threads) {
    sum_t s;
    memset(&s, 0, sizeof s);
    s.p = p;
    s.n = n / 64 * 64;
    pthread_once(&fork_once, register_atfork);
    pthread_mutex_lock(&pool.call_lock);
    s.threads = pool_threads((int)(threads > MAX_THREADS ? MAX_THREADS : threads));
    pool_run(s.threads, run_sum, &s);
    pthread_mutex_unlock(&pool.call_lock);
    double t = 0;
    for (int i = 0; i < s.threads; i++) t += s.part[i];
    return t;
}
