/* Fused split-KV decode attention for CPU caches (the 'native' backend).
 *
 * One call computes the unnormalised attention state of a query group over the
 * tokens [start, end) of ONE sequence: for every KV head h and every query q of
 * its group (GQA), with scores s_t = q . k_t (q already scaled),
 *     m   = max_t s_t,   l = sum_t exp(s_t - m),   acc = sum_t exp(s_t - m) v_t.
 * An empty range gives m = -inf, l = 0, acc = 0 (the merge identity).
 *
 * K/V elements (float32, bfloat16 or float16) are converted to float32 in
 * registers inside the dot products and the value accumulation: each element
 * is read from memory once per call, nothing is written but the state.  All
 * arithmetic is float32.  Tokens are walked in tiles of TILE with an online
 * softmax (natural exp), so at most group x TILE scores exist per head.
 *
 * Layout: q, acc [kv_heads, group, head_dim] and m, l [kv_heads, group],
 * contiguous float32.  Token t of K lives at
 *     k + page(t) * k_page + (t - page_first(t)) * k_tok + h * k_head + d * itemsize
 * (byte strides; head_dim has stride 1), where for a contiguous cache
 * (pages == NULL) page(t) = 0, and for a paged cache page(t) = pages[t / page_size].
 *
 * Two implementations with identical results up to float32 rounding: AVX-512
 * (F, BW, VL; chosen when the compiler targets it) and portable C.
 * Returns 0, or -1 for an unknown dtype / -2 when scratch memory is unavailable.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };
#define TILE 64

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
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

static inline size_t itemsize_of(int dt) { return dt == DT_F32 ? 4 : 2; }

/* Byte address of token t's row (head 0) in a K or V cache. */
static inline const char *token_row(const char *base, int64_t t, int64_t tok, const int64_t *pages,
                                    int64_t page_size, int64_t page) {
    if (!pages) return base + t * tok;
    return base + pages[t / page_size] * page + (t % page_size) * tok;
}

/* ---------------------------------------------------------------- portable C */

static void to_f32(const char *src, int dt, int64_t n, float *dst) {
    if (dt == DT_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (dt == DT_BF16) {
        for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, src + 2 * i, 2); dst[i] = bf16_to_f32(h); }
    } else {
        for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, src + 2 * i, 2); dst[i] = f16_to_f32(h); }
    }
}

static void update_softmax(float *sg, int64_t n, float *m, float *l, float *ag, int64_t D, int vector_exp);

static void range_portable(int dt, const float *q, int64_t H, int64_t G, int64_t D,
                           const char *k, const char *v, int64_t k_tok, int64_t k_head, int64_t v_tok,
                           int64_t v_head, const int64_t *pages, int64_t page_size, int64_t k_page,
                           int64_t v_page, int64_t start, int64_t end, float *acc, float *m, float *l,
                           float *sc, float *row) {
    for (int64_t s = start; s < end; s += TILE) {
        int64_t n = end - s < TILE ? end - s : TILE;
        for (int64_t h = 0; h < H; h++) {
            for (int64_t i = 0; i < n; i++) {
                to_f32(token_row(k, s + i, k_tok, pages, page_size, k_page) + h * k_head, dt, D, row);
                for (int64_t g = 0; g < G; g++) {
                    const float *qg = q + (h * G + g) * D;
                    float dot = 0.0f;
                    for (int64_t d = 0; d < D; d++) dot += qg[d] * row[d];
                    sc[g * TILE + i] = dot;
                }
            }
            for (int64_t g = 0; g < G; g++)
                update_softmax(sc + g * TILE, n, m + h * G + g, l + h * G + g, acc + (h * G + g) * D, D, 0);
            for (int64_t i = 0; i < n; i++) {
                to_f32(token_row(v, s + i, v_tok, pages, page_size, v_page) + h * v_head, dt, D, row);
                for (int64_t g = 0; g < G; g++) {
                    float p = sc[g * TILE + i], *ag = acc + (h * G + g) * D;
                    for (int64_t d = 0; d < D; d++) ag[d] += p * row[d];
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- AVX-512 */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define HAVE_AVX512 1

/* exp(x) for float32 lanes: x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor
 * polynomial (truncation < 6e-9 relative), scaled by 2^n (gradual underflow
 * down to x = -103.9; exactly 0 below, -inf included).  NaN stays NaN: maxps
 * and minps return their second operand when either is NaN.  Arguments are
 * s - shift <= 0 (or NaN), so the upper clamp never bites. */
static inline __m512 exp512(__m512 x) {
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

/* 16 elements (fewer under mask mk) of a K/V row as float32 lanes. */
static inline __attribute__((always_inline)) __m512 load16(const char *p, int dt, __mmask16 mk) {
    if (dt == DT_F32) return _mm512_maskz_loadu_ps(mk, p);
    __m256i h = _mm256_maskz_loadu_epi16(mk, p);
    if (dt == DT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* Sums of 16 vectors: lane j of the result is the sum of the lanes of v[j]
 * (a transpose-and-add tree: 45 shuffles/adds instead of 16 full reductions). */
static inline __attribute__((always_inline)) __m512 reduce16(const __m512 v[16]) {
    __m512 a[8], b[4], d[2];
    for (int j = 0; j < 8; j++)
        a[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]), _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
    for (int j = 0; j < 4; j++) {
        const __m512d x = _mm512_castps_pd(a[2 * j]), y = _mm512_castps_pd(a[2 * j + 1]);
        b[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    } /* b[j]: each 128-bit lane holds partial sums of v[4j .. 4j+3] */
    for (int j = 0; j < 2; j++)
        d[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88), _mm512_shuffle_f32x4(d[0], d[1], 0xdd));
}

/* acc[h, g, :] += sum_i p[g][i] * v_i[h, :] for every query g of head h, GB queries
 * and CB 16-wide column chunks (GB * CB = 16 accumulators) at a time. */
static inline __attribute__((always_inline)) void values_block(
    const int dt, const int GB, const int CB, int64_t h, int64_t G, int64_t D, int64_t nc, __mmask16 tail,
    int64_t v_head, const char *const *vrow, int64_t n, const float *sc, float *acc) {
    const int64_t isz = (int64_t)itemsize_of(dt);
    for (int64_t g0 = 0; g0 < G; g0 += GB) {
        const int64_t gn = G - g0 < GB ? G - g0 : GB;
        const float *p[4];
        for (int g = 0; g < GB; g++) p[g] = sc + (h * G + g0 + (g < gn ? g : 0)) * TILE;
        for (int64_t c0 = 0; c0 < nc; c0 += CB) {
            __mmask16 mk[8], mg[4];
            for (int j = 0; j < CB; j++)
                mk[j] = c0 + j < nc ? (c0 + j == nc - 1 ? tail : (__mmask16)0xffffu) : (__mmask16)0;
            for (int g = 0; g < GB; g++) mg[g] = g < gn ? (__mmask16)0xffffu : (__mmask16)0;
            float *ag = acc + (h * G + g0) * D + 16 * c0;
            __m512 a[16];
            for (int g = 0; g < GB; g++)
                for (int j = 0; j < CB; j++) a[CB * g + j] = _mm512_maskz_loadu_ps(mk[j] & mg[g], ag + g * D + 16 * j);
            for (int64_t i = 0; i < n; i++) {
                const char *vr = vrow[i] + h * v_head + c0 * 16 * isz;
                __m512 vv[8];
                for (int j = 0; j < CB; j++) vv[j] = load16(vr + j * 16 * isz, dt, mk[j]);
                for (int g = 0; g < GB; g++) {
                    const __m512 pg = _mm512_set1_ps(p[g][i]);
                    for (int j = 0; j < CB; j++) a[CB * g + j] = _mm512_fmadd_ps(pg, vv[j], a[CB * g + j]);
                }
            }
            for (int g = 0; g < GB; g++)
                for (int j = 0; j < CB; j++) _mm512_mask_storeu_ps(ag + g * D + 16 * j, mk[j] & mg[g], a[CB * g + j]);
        }
    }
}

static inline __attribute__((always_inline)) void range_avx512_dt(
    const int dt, const float *q, int64_t H, int64_t G, int64_t D, const char *k, const char *v, int64_t k_tok,
    int64_t k_head, int64_t v_tok, int64_t v_head, const int64_t *pages, int64_t page_size, int64_t k_page,
    int64_t v_page, int64_t start, int64_t end, float *acc, float *m, float *l, float *sc) {
    const int64_t isz = (int64_t)itemsize_of(dt), nc = (D + 15) / 16;
    const __mmask16 tail = (D % 16) ? (__mmask16)((1u << (D % 16)) - 1u) : (__mmask16)0xffffu;
    const char *krow[TILE], *vrow[TILE];
    for (int64_t s = start; s < end; s += TILE) {
        int64_t n = end - s < TILE ? end - s : TILE;
        for (int64_t i = 0; i < n; i++) {
            krow[i] = token_row(k, s + i, k_tok, pages, page_size, k_page);
            vrow[i] = token_row(v, s + i, v_tok, pages, page_size, v_page);
        }
        /* Scores, 4 tokens x 4 queries at a time (16 independent accumulators, one
         * reduction tree); q rows past the group repeat row g0 and are not stored. */
        for (int64_t i = 0; i < n; i += 4) {
            const int64_t tn = n - i < 4 ? n - i : 4;
            for (int64_t h = 0; h < H; h++) {
                const char *kr[4];
                for (int t = 0; t < 4; t++) kr[t] = krow[i + (t < tn ? t : 0)] + h * k_head;
                for (int64_t g0 = 0; g0 < G; g0 += 4) {
                    const int64_t gn = G - g0 < 4 ? G - g0 : 4;
                    const float *qr[4];
                    for (int g = 0; g < 4; g++) qr[g] = q + (h * G + g0 + (g < gn ? g : 0)) * D;
                    __m512 a[16];
                    for (int j = 0; j < 16; j++) a[j] = _mm512_setzero_ps();
                    for (int64_t c = 0; c < nc; c++) {
                        const __mmask16 mk = c == nc - 1 ? tail : (__mmask16)0xffffu;
                        __m512 kk[4];
                        for (int t = 0; t < 4; t++) kk[t] = load16(kr[t] + c * 16 * isz, dt, mk);
                        for (int g = 0; g < 4; g++) {
                            const __m512 qq = _mm512_maskz_loadu_ps(mk, qr[g] + 16 * c);
                            for (int t = 0; t < 4; t++) a[4 * g + t] = _mm512_fmadd_ps(qq, kk[t], a[4 * g + t]);
                        }
                    }
                    /* lane 4g + t = score of query g0+g for token i+t */
                    float r[16];
                    _mm512_storeu_ps(r, reduce16(a));
                    for (int g = 0; g < gn; g++)
                        for (int t = 0; t < tn; t++) sc[(h * G + g0 + g) * TILE + i + t] = r[4 * g + t];
                }
            }
        }
        for (int64_t hg = 0; hg < H * G; hg++)
            update_softmax(sc + hg * TILE, n, m + hg, l + hg, acc + hg * D, D, 1);
        /* Values: GB queries x CB column chunks of 16 in registers, walked over the tile
         * (a whole 128-wide head row per token when head_dim >= 128). */
        for (int64_t h = 0; h < H; h++) {
            if (nc >= 8) values_block(dt, 2, 8, h, G, D, nc, tail, v_head, vrow, n, sc, acc);
            else values_block(dt, 4, 4, h, G, D, nc, tail, v_head, vrow, n, sc, acc);
        }
    }
}
#endif

/* Online-softmax step for one query over a tile of n scores sg[0..n): turns the
 * scores into p = exp(s - shift) in place (shift = the new running max, or 0
 * while it is -inf), rescales l and the accumulator.  NaN and +inf scores
 * propagate into m, l and acc (the NaN/inf policy of attention/state.py). */
static void update_softmax(float *sg, int64_t n, float *m, float *l, float *ag, int64_t D, int vector_exp) {
    float mx = sg[0];
    for (int64_t i = 1; i < n; i++) mx = (sg[i] > mx || sg[i] != sg[i]) ? sg[i] : mx; /* NaN sticks */
    const float m_new = (mx > *m || mx != mx) ? mx : *m;
    const float shift = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = expf(*m - shift); /* 0 when *m = -inf */
    float sum = 0.0f;
#ifdef HAVE_AVX512
    if (vector_exp) {
        __m512 vs = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffffu : (__mmask16)((1u << (n - i)) - 1u);
            const __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, sg + i), _mm512_set1_ps(shift)));
            _mm512_mask_storeu_ps(sg + i, mk, p);
            vs = _mm512_mask_add_ps(vs, mk, vs, p);
        }
        sum = _mm512_reduce_add_ps(vs);
    } else
#endif
    {
        (void)vector_exp;
        for (int64_t i = 0; i < n; i++) { sg[i] = expf(sg[i] - shift); sum += sg[i]; }
    }
    if (alpha != 1.0f)
        for (int64_t d = 0; d < D; d++) ag[d] *= alpha;
    *l = *l * alpha + sum;
    *m = m_new;
}

const char *treecoll_decode_isa(void) {
#ifdef HAVE_AVX512
    return "avx512";
#else
    return "portable";
#endif
}

int treecoll_decode_range(const float *q, const void *k, const void *v, int dt, int64_t H, int64_t G, int64_t D,
                          int64_t k_tok, int64_t k_head, int64_t v_tok, int64_t v_head, const int64_t *pages,
                          int64_t page_size, int64_t k_page, int64_t v_page, int64_t start, int64_t end,
                          float *acc, float *m, float *l, int portable) {
    if (dt != DT_F32 && dt != DT_BF16 && dt != DT_F16) return -1;
    for (int64_t i = 0; i < H * G; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
    memset(acc, 0, (size_t)(H * G * D) * sizeof(float));
    if (end <= start) return 0;
    float *sc = malloc((size_t)(H * G * TILE + D) * sizeof(float));
    if (!sc) return -2;
    const char *kc = k, *vc = v;
#ifdef HAVE_AVX512
    if (!portable) {
#define CALL(DT) range_avx512_dt(DT, q, H, G, D, kc, vc, k_tok, k_head, v_tok, v_head, pages, page_size, \
                                 k_page, v_page, start, end, acc, m, l, sc)
        if (dt == DT_BF16) CALL(DT_BF16);
        else if (dt == DT_F16) CALL(DT_F16);
        else CALL(DT_F32);
#undef CALL
        free(sc);
        return 0;
    }
#endif
    (void)portable;
    range_portable(dt, q, H, G, D, kc, vc, k_tok, k_head, v_tok, v_head, pages, page_size, k_page, v_page, start,
                   end, acc, m, l, sc, sc + H * G * TILE);
    free(sc);
    return 0;
}
