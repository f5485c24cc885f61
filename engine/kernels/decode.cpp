// kvproxy's decode step: one token for each of B sequences through a pre-norm decoder (Llama,
// Mistral, Qwen2, Qwen3, Phi-3 wiring), computed in float32 straight from each weight matrix's
// own storage: float32 rows, or the GGUF block codes Q4_0, Q4_1 and Q8_0 (32 weights a block:
// an fp16 scale, for Q4_1 an fp16 minimum, and 4- or 8-bit codes), turned into floats in
// registers and multiplied at once; no de-quantized copy exists.
//
// Exactness: every product and sum is float32; a row's dot product is summed in the same order
// whatever the batch, so a sequence's result never depends on the others in the step. Layouts:
// ggml's (ggml-common.h: block_q4_0, block_q4_1, block_q8_0; a Q4 block's byte j holds weight j
// in its low nibble and weight j + 16 in its high nibble).
//
// Built once per machine by engine/kernels/build.py (g++ -O3 -march=native); called through
// ctypes. A step's work is shared in units (rows of a matrix, positions of an attention pass) among
// the calling thread and the helpers of team.h that are running.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "team.h"
#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define KVP_AVX2 1  // the 8-lane path: CPUs with AVX2 and FMA but no AVX-512 (Zen 1-3, most desktops)
#endif

extern "C" {

enum Kind { F32 = 0, Q4_0 = 1, Q4_1 = 2, Q8_0 = 3 };

struct Linear {            // a weight matrix [rows (out), cols (in)] and an optional bias [rows]
    int32_t kind, rows, cols, pad;
    const void* data;      // F32: rows * cols floats; else rows * cols / 32 blocks, row-major
    const float* bias;
};

struct Layer {
    const float* attn_norm;          // [hidden]
    Linear q, k, v, o;
    const float* q_norm;             // [head_dim] (Qwen3) or null
    const float* k_norm;
    const float* ffn_norm;           // [hidden]
    Linear gate, up, down;
    int32_t window, pad;             // sliding window in positions (the last ``window``), 0: all
};

struct Model {
    int32_t n_layers, hidden, n_heads, n_kv_heads, head_dim, inter, vocab, max_pos;
    float eps, scale;                // RMSNorm epsilon; attention scaling (head_dim ** -0.5)
    Linear embed;                    // [vocab, hidden]: the token's row is its embedding
    Linear head;                     // [vocab, hidden]
    const float* final_norm;         // [hidden]
    const float* cos_table;          // [max_pos, head_dim], transformers' rotary values
    const float* sin_table;
    const Layer* layers;
};

}  // extern "C"

namespace {

constexpr int QK = 32;
constexpr int CHUNK = 256;  // positions per attention work item

inline float fp16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#endif
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal
            int e = -1;
            uint32_t m = man;
            do { e++; m <<= 1; } while ((m & 0x400u) == 0);
            bits = sign | (uint32_t(127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline int block_bytes(int kind) { return kind == Q4_0 ? 18 : kind == Q4_1 ? 20 : kind == Q8_0 ? 34 : 0; }

#if defined(__AVX512F__)
inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// e^x for 16 lanes, within 2 ulp (Cephes' expf: 2^n times a degree-6 polynomial).
inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-88.3762626647949f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

#if defined(KVP_AVX2)
// The 8 lanes summed in one fixed order.
inline float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

// e^x for 8 lanes, as exp16 computes it; 2^n applied as two powers of two (AVX2 has no scalef),
// each a float of its own for every n the clamp allows.
inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-88.3762626647949f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i k = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(k, 1);
    const auto two_to = [](__m256i e) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
    };
    return _mm256_mul_ps(_mm256_mul_ps(p, two_to(half)), two_to(_mm256_sub_epi32(k, half)));
}

// The 32 weights of a Q4_0, Q4_1 or Q8_0 block as four vectors of 8 (weights 0-7, 8-15, 16-23, 24-31).
inline void block_weights(const uint8_t* blk, int kind, __m256 w[4]) {
    if (kind == Q8_0) {
        for (int i = 0; i < 4; i++)
            w[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * i))));
        return;
    }
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (kind == Q4_1 ? 4 : 2)));
    const __m128i mask = _mm_set1_epi8(0x0f);
    __m128i ql = _mm_and_si128(q, mask), qh = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    if (kind == Q4_0) {  // codes are offset by 8
        ql = _mm_sub_epi8(ql, _mm_set1_epi8(8));
        qh = _mm_sub_epi8(qh, _mm_set1_epi8(8));
    }
    const __m128i parts[4] = {ql, _mm_srli_si128(ql, 8), qh, _mm_srli_si128(qh, 8)};
    for (int i = 0; i < 4; i++)
        w[i] = _mm256_cvtepi32_ps(kind == Q4_0 ? _mm256_cvtepi8_epi32(parts[i]) : _mm256_cvtepu8_epi32(parts[i]));
}
#endif

// sum_j a[j] * b[j], lanes of 16 (8 with AVX2) summed in a fixed order (n a multiple of the lanes in
// the fast path).
inline float dot(const float* a, const float* b, int n) {
#if defined(__AVX512F__)
    if (n % 16 == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (int j = 0; j < n; j += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), acc);
        return hsum(acc);
    }
#elif defined(KVP_AVX2)
    if (n % 8 == 0) {
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < n; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc);
        return hsum(acc);
    }
#endif
    float s = 0;
    for (int j = 0; j < n; j++) s += a[j] * b[j];
    return s;
}

// y[j] += w * x[j]
inline void axpy(float w, const float* x, float* y, int n) {
    for (int j = 0; j < n; j++) y[j] += w * x[j];
}

// v[i] = e^(v[i] - top); returns their sum
inline float exp_shifted(float* v, int n, float top) {
    int i = 0;
    float total = 0;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(v + i), _mm512_set1_ps(top)));
        _mm512_storeu_ps(v + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    total = hsum(acc);
#elif defined(KVP_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(top)));
        _mm256_storeu_ps(v + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    total = hsum(acc);
#endif
    for (; i < n; i++) {
        v[i] = std::exp(v[i] - top);
        total += v[i];
    }
    return total;
}

// y[s][r - r0] = W[r] . x[s] (+ bias) for rows [r0, r1) and the NB vectors x[0..NB) (stride ldx),
// written to y (stride ldy; y points at row r0). xsum[s][b]: the sum of x[s]'s block b (Q4_1's
// minimum term). Each row's sum runs in one fixed order, whatever rows or vectors come with it.
// NOTE: no contraction of a product and a sum into one fused multiply-add here (GCC's default,
// -ffp-contract=fast, fuses where it likes): it fused d * t + m * s on one product or the other as it
// chose per instance, so without AVX-512 a batch's first row differed from the same row alone (seen
// on Zen 3). The fused operations wanted are written as such (the _fmadd_ intrinsics).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
template <int NB>
void rows_kernel(const Linear& W, int r0, int r1, const float* x, int ldx, const float* xsum, float* y, int ldy) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    const int nb = W.cols / QK;
    const int bb = block_bytes(W.kind);
    for (int r = r0; r < r1; r++) {
        float out[NB];
        if (W.kind == F32) {
            const float* w = static_cast<const float*>(W.data) + size_t(r) * W.cols;
#if defined(__AVX512F__)
            __m512 acc[NB];
            for (int s = 0; s < NB; s++) acc[s] = _mm512_setzero_ps();
            for (int j = 0; j < W.cols; j += 16) {
                const __m512 wv = _mm512_loadu_ps(w + j);
                for (int s = 0; s < NB; s++) acc[s] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + s * ldx + j), acc[s]);
            }
            for (int s = 0; s < NB; s++) out[s] = hsum(acc[s]);
#elif defined(KVP_AVX2)
            __m256 acc[NB];
            for (int s = 0; s < NB; s++) acc[s] = _mm256_setzero_ps();
            for (int j = 0; j < W.cols; j += 8) {
                const __m256 wv = _mm256_loadu_ps(w + j);
                for (int s = 0; s < NB; s++) acc[s] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + s * ldx + j), acc[s]);
            }
            for (int s = 0; s < NB; s++) out[s] = hsum(acc[s]);
#else
            for (int s = 0; s < NB; s++) {
                float a = 0;
                for (int j = 0; j < W.cols; j++) a += w[j] * x[s * ldx + j];
                out[s] = a;
            }
#endif
        } else {
            const uint8_t* row = static_cast<const uint8_t*>(W.data) + size_t(r) * nb * bb;
#if defined(__AVX512F__)
            __m512 acc[NB];
            float mins[NB];
            for (int s = 0; s < NB; s++) { acc[s] = _mm512_setzero_ps(); mins[s] = 0; }
            for (int b = 0; b < nb; b++) {
                const uint8_t* blk = row + b * bb;
                const __m512 d = _mm512_set1_ps(fp16(blk));
                __m512 lo, hi;
                if (W.kind == Q8_0) {
                    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
                    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
                    lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0));
                    hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1));
                } else {
                    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (W.kind == Q4_1 ? 4 : 2)));
                    const __m128i mask = _mm_set1_epi8(0x0f);
                    __m128i ql = _mm_and_si128(q, mask), qh = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
                    if (W.kind == Q4_0) {  // codes are offset by 8
                        ql = _mm_sub_epi8(ql, _mm_set1_epi8(8));
                        qh = _mm_sub_epi8(qh, _mm_set1_epi8(8));
                        lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ql));
                        hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(qh));
                    } else {
                        lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(ql));
                        hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(qh));
                    }
                }
                const float m = W.kind == Q4_1 ? fp16(blk + 2) : 0.0f;
                for (int s = 0; s < NB; s++) {
                    const float* xs = x + s * ldx + b * QK;
                    const __m512 t = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xs + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(xs)));
                    acc[s] = _mm512_fmadd_ps(d, t, acc[s]);
                    mins[s] += m * xsum[s * nb + b];
                }
            }
            for (int s = 0; s < NB; s++) out[s] = hsum(acc[s]) + mins[s];
#elif defined(KVP_AVX2)
            __m256 acc[NB];
            float mins[NB];
            for (int s = 0; s < NB; s++) { acc[s] = _mm256_setzero_ps(); mins[s] = 0; }
            for (int b = 0; b < nb; b++) {
                const uint8_t* blk = row + b * bb;
                const __m256 d = _mm256_set1_ps(fp16(blk));
                __m256 w[4];
                block_weights(blk, W.kind, w);
                const float m = W.kind == Q4_1 ? fp16(blk + 2) : 0.0f;
                for (int s = 0; s < NB; s++) {
                    const float* xs = x + s * ldx + b * QK;
                    __m256 t = _mm256_mul_ps(w[0], _mm256_loadu_ps(xs));
                    t = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xs + 8), t);
                    t = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xs + 16), t);
                    t = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xs + 24), t);
                    acc[s] = _mm256_fmadd_ps(d, t, acc[s]);
                    mins[s] += m * xsum[s * nb + b];
                }
            }
            for (int s = 0; s < NB; s++) out[s] = hsum(acc[s]) + mins[s];
#else
            for (int s = 0; s < NB; s++) out[s] = 0;
            for (int b = 0; b < nb; b++) {
                const uint8_t* blk = row + b * bb;
                const float d = fp16(blk), m = W.kind == Q4_1 ? fp16(blk + 2) : 0.0f;
                float w[QK];
                if (W.kind == Q8_0) {
                    for (int j = 0; j < QK; j++) w[j] = float(int8_t(blk[2 + j]));
                } else {
                    const uint8_t* q = blk + (W.kind == Q4_1 ? 4 : 2);
                    const int off = W.kind == Q4_0 ? 8 : 0;
                    for (int j = 0; j < 16; j++) {
                        w[j] = float(int(q[j] & 0x0f) - off);
                        w[j + 16] = float(int(q[j] >> 4) - off);
                    }
                }
                for (int s = 0; s < NB; s++) {
                    const float* xs = x + s * ldx + b * QK;
                    float t = 0;
                    for (int j = 0; j < QK; j++) t += w[j] * xs[j];
                    out[s] += d * t + m * xsum[s * nb + b];
                }
            }
#endif
        }
        for (int s = 0; s < NB; s++) y[s * ldy + r - r0] = out[s] + (W.bias ? W.bias[r] : 0.0f);
    }
}
#pragma GCC pop_options

void rms_norm(const float* x, const float* w, float eps, int n, float* out) {
    const float ss = dot(x, x, n);
    const float inv = 1.0f / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

void rope(float* v, const float* cos, const float* sin, int dim) {
    const int half = dim / 2;
    float tmp[512];
    for (int i = 0; i < half; i++) {
        tmp[i] = v[i] * cos[i] - v[i + half] * sin[i];
        tmp[i + half] = v[i + half] * cos[i + half] + v[i] * sin[i + half];
    }
    std::memcpy(v, tmp, sizeof(float) * dim);
}

// g[i] = silu(g[i]) * u[i], silu(x) = x / (1 + e^-x)
inline void silu_mul(float* g, const float* u, int n) {
    int i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
    }
#elif defined(KVP_AVX2)
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}


// rows_kernel over the B vectors, GROUP at a time: each group reads the rows' weights once. With
// AVX-512's 32 registers a group of 8 keeps its accumulators in registers; with AVX2's 16, 4.
#if defined(__AVX512F__)
constexpr int GROUP = 8;
#else
constexpr int GROUP = 4;
#endif

void rows(const Linear& W, int r0, int r1, int B, const float* x, int ldx, const float* xsum, float* y, int ldy) {
    const int nb = W.cols / QK;
    for (int s = 0; s < B; s += GROUP) {
        const float* xs = x + s * ldx;
        const float* ss = xsum + s * nb;
        float* ys = y + s * ldy;
        switch (std::min(B - s, GROUP)) {
            case 1: rows_kernel<1>(W, r0, r1, xs, ldx, ss, ys, ldy); break;
            case 2: rows_kernel<2>(W, r0, r1, xs, ldx, ss, ys, ldy); break;
            case 3: rows_kernel<3>(W, r0, r1, xs, ldx, ss, ys, ldy); break;
            case 4: rows_kernel<4>(W, r0, r1, xs, ldx, ss, ys, ldy); break;
#if defined(__AVX512F__)
            case 5: rows_kernel<5>(W, r0, r1, xs, ldx, ss, ys, ldy); break;
            case 6: rows_kernel<6>(W, r0, r1, xs, ldx, ss, ys, ldy); break;
            case 7: rows_kernel<7>(W, r0, r1, xs, ldx, ss, ys, ldy); break;
            default: rows_kernel<8>(W, r0, r1, xs, ldx, ss, ys, ldy); break;
#else
            default: break;
#endif
        }
    }
}

// xsum[s][b] = the sum of block b of x[s] (Q4_1's minimum term), when one of W[0..n) needs it.
void block_sums(const Linear* const* W, int n, int B, const float* x, int ldx, float* xsum) {
    bool minimum = false;
    for (int i = 0; i < n; i++) minimum |= W[i]->kind == Q4_1;
    if (!minimum) return;
    const int nb = W[0]->cols / QK;
    for (int i = 0; i < B * nb; i++) {
        const float* xs = x + (i / nb) * ldx + (i % nb) * QK;
        float t = 0;
        for (int j = 0; j < QK; j++) t += xs[j];
        xsum[i] = t;
    }
}

inline int64_t row_bytes(const Linear& W) {
    return W.kind == F32 ? int64_t(W.cols) * 4 : int64_t(W.cols / QK) * block_bytes(W.kind);
}


// The matrices W[0..n) (n <= 3, one input width) applied to the B vectors x, matrix i's outputs to
// y[i] (row stride ldy[i]): their rows, taken together, in units (q, k and v, or gate and up, are
// one phase, as one fused matrix would be).
// ptr: W[0..3), y at 3..6, x, xsum; num: n, ldy[0..3) at 1..4, B, ldx, total rows.
void matmul_run(const team::Phase& p, int u, float* out) {
    const int64_t n = p.num[0], B = p.num[4], total = p.num[6];
    const int64_t lo = u * int64_t(p.per), hi = std::min(total, lo + p.per);
    for (int64_t i = 0, base = 0; i < n; i++) {
        const Linear& W = *static_cast<const Linear*>(p.ptr[i]);
        const int64_t r0 = std::max(lo - base, int64_t(0)), r1 = std::min(hi - base, int64_t(W.rows));
        if (r0 < r1) {
            float* y = out ? out + (base + r0 - lo) : static_cast<float*>(const_cast<void*>(p.ptr[3 + i])) + r0;
            const int ld = int(out ? hi - lo : p.num[1 + i]);
            rows(W, int(r0), int(r1), int(B), static_cast<const float*>(p.ptr[6]), int(p.num[5]),
                 static_cast<const float*>(p.ptr[7]), y, ld);
        }
        base += W.rows;
    }
}

void matmul_commit(const team::Phase& p, int u, const float* out) {
    const int64_t n = p.num[0], B = p.num[4], total = p.num[6];
    const int64_t lo = u * int64_t(p.per), hi = std::min(total, lo + p.per);
    for (int64_t i = 0, base = 0; i < n; i++) {
        const int64_t rows_i = static_cast<const Linear*>(p.ptr[i])->rows;
        const int64_t r0 = std::max(lo - base, int64_t(0)), r1 = std::min(hi - base, rows_i);
        float* y = static_cast<float*>(const_cast<void*>(p.ptr[3 + i]));
        for (int64_t s = 0; r0 < r1 && s < B; s++)
            std::memcpy(y + s * p.num[1 + i] + r0, out + s * (hi - lo) + base + r0 - lo, sizeof(float) * (r1 - r0));
        base += rows_i;
    }
}

team::Phase matmul_phase(const Linear* const* W, float* const* y, const int* ldy, int n, int B, const float* x,
                         int ldx, const float* xsum, int64_t unit_bytes) {
    team::Phase p{};
    p.run = matmul_run;
    p.commit = matmul_commit;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        p.ptr[i] = W[i];
        p.ptr[3 + i] = y[i];
        p.num[1 + i] = ldy[i];
        total += W[i]->rows;
    }
    p.ptr[6] = x;
    p.ptr[7] = xsum;
    p.num[0] = n;
    p.num[4] = B;
    p.num[5] = ldx;
    p.num[6] = total;
    const int64_t per = std::max((total + team::MAX_UNITS - 1) / team::MAX_UNITS,
                                 (unit_bytes + row_bytes(*W[0]) - 1) / row_bytes(*W[0]));
    p.per = int(std::min(per, total));
    p.units = int((total + p.per - 1) / p.per);
    p.private_floats = int64_t(B) * p.per;
    return p;
}

void matmul(team::Team& team, int64_t unit_bytes, const Linear& W, int B, const float* x, int ldx, float* xsum,
            float* y, int ldy) {
    const Linear* ws[1] = {&W};
    float* ys[1] = {y};
    const int lds[1] = {ldy};
    block_sums(ws, 1, B, x, ldx, xsum);
    team.run(matmul_phase(ws, ys, lds, 1, B, x, ldx, xsum, unit_bytes));
}

// The first position a query at position n - 1 attends to in layer L.
inline int first(const Layer& L, int n) { return L.window > 0 ? std::max(0, n - L.window) : 0; }

// What every phase of one step reads: the model, the sequences, the scratch buffers.
struct Step {
    const Model* m;
    int B, max_len, chunks, ldq;
    int64_t unit_bytes;
    const int64_t* positions;
    float** k_cache;
    float** v_cache;
    const int64_t* capacity;
    float *qkv, *probs, *partial, *att;
};

// Attention, in four phases over (sequence, K/V head, chunk of CHUNK positions) or (sequence, head):
// each position's K and V read once for the heads sharing them, the work split evenly however few
// sequences run; every sum in a fixed order (chunk by chunk). num[0]: the layer; num[1]: the items.
struct Item {  // item i of a (sequence, K/V head, chunk) phase
    int s, kvh, c, t0, t1;
    Item(const Step& st, const Layer& L, int64_t i) {
        const int NKV = st.m->n_kv_heads;
        s = int(i / (NKV * st.chunks));
        kvh = int((i / st.chunks) % NKV);
        c = int(i % st.chunks);
        const int n = int(st.positions[s]) + 1;
        t1 = std::min(n, c * CHUNK + CHUNK);
        t0 = std::max(c * CHUNK, first(L, n));
    }
};

inline const Step& step_of(const team::Phase& p) { return *static_cast<const Step*>(p.ctx); }
inline const Layer& layer_of(const team::Phase& p) { return step_of(p).m->layers[p.num[0]]; }
inline int64_t unit_lo(const team::Phase& p, int u) { return int64_t(u) * p.per; }
inline int64_t unit_hi(const team::Phase& p, int u) { return std::min(p.num[1], unit_lo(p, u) + p.per); }

// scores: probs[s, head, t] = q . k_t * scale (private: [item][group][CHUNK])
void scores_run(const team::Phase& p, int u, float* out) {
    const Step& st = step_of(p);
    const Layer& L = layer_of(p);
    const Model* m = st.m;
    const int D = m->head_dim, NH = m->n_heads, group = NH / m->n_kv_heads;
    for (int64_t i = unit_lo(p, u); i < unit_hi(p, u); i++) {
        const Item it(st, L, i);
        const float* kc = st.k_cache[it.s * m->n_layers + p.num[0]] + size_t(it.kvh) * st.capacity[it.s] * D;
        for (int t = it.t0; t < it.t1; t++)
            for (int g = 0; g < group; g++) {
                const int hh = it.kvh * group + g;
                float* dst = out ? out + ((i - unit_lo(p, u)) * group + g) * CHUNK + (t - it.c * CHUNK)
                                 : st.probs + size_t(it.s * NH + hh) * st.max_len + t;
                *dst = dot(st.qkv + it.s * st.ldq + hh * D, kc + size_t(t) * D, D) * m->scale;
            }
    }
}

void scores_commit(const team::Phase& p, int u, const float* out) {
    const Step& st = step_of(p);
    const Layer& L = layer_of(p);
    const int NH = st.m->n_heads, group = NH / st.m->n_kv_heads;
    for (int64_t i = unit_lo(p, u); i < unit_hi(p, u); i++) {
        const Item it(st, L, i);
        for (int g = 0; it.t0 < it.t1 && g < group; g++)
            std::memcpy(st.probs + size_t(it.s * NH + it.kvh * group + g) * st.max_len + it.t0,
                        out + ((i - unit_lo(p, u)) * group + g) * CHUNK + (it.t0 - it.c * CHUNK),
                        sizeof(float) * (it.t1 - it.t0));
    }
}

// softmax of each (sequence, head)'s scores over the positions it attends to (private: a row)
void softmax_run(const team::Phase& p, int u, float* out) {
    const Step& st = step_of(p);
    const Layer& L = layer_of(p);
    for (int64_t i = unit_lo(p, u); i < unit_hi(p, u); i++) {
        const int n = int(st.positions[i / st.m->n_heads]) + 1, t0 = first(L, n);
        float* row = st.probs + size_t(i) * st.max_len;
        if (out) row = static_cast<float*>(std::memcpy(out + (i - unit_lo(p, u)) * st.max_len, row, sizeof(float) * n));
        float top = -INFINITY;
        for (int t = t0; t < n; t++) top = row[t] > top ? row[t] : top;
        const float inv = 1.0f / exp_shifted(row + t0, n - t0, top);
        for (int t = t0; t < n; t++) row[t] *= inv;
    }
}

void softmax_commit(const team::Phase& p, int u, const float* out) {
    const Step& st = step_of(p);
    const Layer& L = layer_of(p);
    for (int64_t i = unit_lo(p, u); i < unit_hi(p, u); i++) {
        const int n = int(st.positions[i / st.m->n_heads]) + 1, t0 = first(L, n);
        std::memcpy(st.probs + size_t(i) * st.max_len + t0, out + (i - unit_lo(p, u)) * st.max_len + t0,
                    sizeof(float) * (n - t0));
    }
}

// values: partial[item, g] = sum over the chunk's positions of probs * v (private: [item][group][D])
void values_run(const team::Phase& p, int u, float* out) {
    const Step& st = step_of(p);
    const Layer& L = layer_of(p);
    const Model* m = st.m;
    const int D = m->head_dim, NH = m->n_heads, group = NH / m->n_kv_heads;
    for (int64_t i = unit_lo(p, u); i < unit_hi(p, u); i++) {
        const Item it(st, L, i);
        const float* vc = st.v_cache[it.s * m->n_layers + p.num[0]] + size_t(it.kvh) * st.capacity[it.s] * D;
        float* part = (out ? out + (i - unit_lo(p, u)) * group * D : st.partial + size_t(i) * group * D);
        for (int j = 0; j < group * D; j++) part[j] = 0;
        for (int t = it.t0; t < it.t1; t++)
            for (int g = 0; g < group; g++)
                axpy(st.probs[size_t(it.s * NH + it.kvh * group + g) * st.max_len + t], vc + size_t(t) * D, part + g * D, D);
    }
}

// the chunks' partial sums of each (sequence, head), in chunk order (private: [item][D])
void combine_run(const team::Phase& p, int u, float* out) {
    const Step& st = step_of(p);
    const Model* m = st.m;
    const int D = m->head_dim, NH = m->n_heads, NKV = m->n_kv_heads, group = NH / NKV;
    for (int64_t i = unit_lo(p, u); i < unit_hi(p, u); i++) {
        const int s = int(i / NH), hh = int(i % NH), kvh = hh / group, g = hh % group;
        float* dst = out ? out + (i - unit_lo(p, u)) * D : st.att + size_t(i) * D;  // att: [B, NH * D]
        for (int j = 0; j < D; j++) dst[j] = 0;
        for (int c = 0; c < st.chunks; c++)
            axpy(1.0f, st.partial + (size_t((s * NKV + kvh) * st.chunks + c) * group + g) * D, dst, D);
    }
}

// values and combine write a whole contiguous run of ``width`` floats per item
template <int Which>
void contiguous_commit(const team::Phase& p, int u, const float* out) {
    const Step& st = step_of(p);
    const int64_t width = Which == 0 ? int64_t(st.m->n_heads / st.m->n_kv_heads) * st.m->head_dim : st.m->head_dim;
    float* base = Which == 0 ? st.partial : st.att;
    std::memcpy(base + unit_lo(p, u) * width, out, sizeof(float) * (unit_hi(p, u) - unit_lo(p, u)) * width);
}

// ``items`` items of about ``bytes_per_item`` bytes of work each, in units of about st.unit_bytes.
team::Phase attention_phase(const Step& st, int l, team::Run run, team::Commit commit, int64_t items,
                            int64_t floats_per_item, int64_t bytes_per_item) {
    team::Phase p{};
    p.run = run;
    p.commit = commit;
    p.ctx = &st;
    p.num[0] = l;
    p.num[1] = items;
    const int64_t per = std::max((items + team::MAX_UNITS - 1) / team::MAX_UNITS,
                                 (st.unit_bytes + bytes_per_item - 1) / std::max<int64_t>(bytes_per_item, 1));
    p.per = int(std::max<int64_t>(1, std::min(per, items)));
    p.units = int((items + p.per - 1) / p.per);
    p.private_floats = p.per * floats_per_item;
    return p;
}

void attention(team::Team& team, const Step& st, int l) {
    const Model* m = st.m;
    const int64_t group = m->n_heads / m->n_kv_heads, per_kv = int64_t(st.B) * m->n_kv_heads * st.chunks;
    const int64_t heads = int64_t(st.B) * m->n_heads;
    // NOTE: the work of an item in bytes: the K or V rows it reads; a row of scores (whose
    // exponentials cost about as much as reading 4 floats each); the partial sums it adds
    const int64_t D = m->head_dim, positions = std::min(st.max_len, CHUNK);
    team.run(attention_phase(st, l, scores_run, scores_commit, per_kv, group * CHUNK, positions * D * 4));
    team.run(attention_phase(st, l, softmax_run, softmax_commit, heads, st.max_len, st.max_len * 16));
    team.run(attention_phase(st, l, values_run, contiguous_commit<0>, per_kv, group * D, positions * D * 4));
    team.run(attention_phase(st, l, combine_run, contiguous_commit<1>, heads, D, st.chunks * D * 4));
}

// The new token's embedding, each sequence's on the leader (one row each).
void embed(const Model* m, int B, const int64_t* tokens, float* x) {
    const int H = m->hidden;
    const Linear& E = m->embed;
    for (int s = 0; s < B; s++) {
        float* out = x + s * H;
        if (E.kind == F32) {
            std::memcpy(out, static_cast<const float*>(E.data) + size_t(tokens[s]) * H, sizeof(float) * H);
            continue;
        }
        const int nb = H / QK, bb = block_bytes(E.kind);
        const uint8_t* row = static_cast<const uint8_t*>(E.data) + size_t(tokens[s]) * nb * bb;
        for (int b = 0; b < nb; b++) {
            const uint8_t* blk = row + b * bb;
            const float d = fp16(blk), mn = E.kind == Q4_1 ? fp16(blk + 2) : 0.0f;
            for (int j = 0; j < QK; j++) {
                float q;
                if (E.kind == Q8_0) q = float(int8_t(blk[2 + j]));
                else {
                    const uint8_t c = (blk + (E.kind == Q4_1 ? 4 : 2))[j % 16];
                    q = float(int(j < 16 ? c & 0x0f : c >> 4) - (E.kind == Q4_0 ? 8 : 0));
                }
                out[b * QK + j] = d * q + mn;
            }
        }
    }
}

// Per-head norms (Qwen3) and rotary of the new q and k, and the new K/V into the caches (leader).
void rotate_and_store(const Step& st, int l) {
    const Model* m = st.m;
    const Layer& L = m->layers[l];
    const int D = m->head_dim, NH = m->n_heads, NKV = m->n_kv_heads, QD = NH * D, KD = NKV * D;
    for (int s = 0; s < st.B; s++) {
        float* q = st.qkv + s * st.ldq;
        float* k = q + QD;
        float* v = k + KD;
        const int64_t pos = st.positions[s];
        const float* cs = m->cos_table + pos * D;
        const float* sn = m->sin_table + pos * D;
        for (int hh = 0; hh < NH; hh++) {
            if (L.q_norm) rms_norm(q + hh * D, L.q_norm, m->eps, D, q + hh * D);
            rope(q + hh * D, cs, sn, D);
        }
        float* kc = st.k_cache[s * m->n_layers + l];
        float* vc = st.v_cache[s * m->n_layers + l];
        for (int hh = 0; hh < NKV; hh++) {
            if (L.k_norm) rms_norm(k + hh * D, L.k_norm, m->eps, D, k + hh * D);
            rope(k + hh * D, cs, sn, D);
            std::memcpy(kc + (size_t(hh) * st.capacity[s] + pos) * D, k + hh * D, sizeof(float) * D);
            std::memcpy(vc + (size_t(hh) * st.capacity[s] + pos) * D, v + hh * D, sizeof(float) * D);
        }
    }
}

}  // namespace

extern "C" {

// Copy the first ``num_tokens`` positions of ``n_blocks`` blocks (each [layers, heads, 128, dim])
// into a past buffer [layers, heads, capacity, dim]: one memcpy per block, layer and head, on the
// calling thread alone (the lookup stage's; no OpenMP team of its own).
void kvp_gather(float* dst, int64_t layers, int64_t heads, int64_t capacity, int64_t dim,
                const float* const* blocks, int32_t n_blocks, int64_t num_tokens) {
    constexpr int64_t B = 128;
    for (int32_t i = 0; i < n_blocks; i++) {
        const int64_t start = i * B, n = std::min(B, num_tokens - start);
        if (n <= 0) break;
        for (int64_t l = 0; l < layers; l++)
            for (int64_t h = 0; h < heads; h++)
                std::memcpy(dst + ((l * heads + h) * capacity + start) * dim,
                            blocks[i] + (l * heads + h) * B * dim, sizeof(float) * n * dim);
    }
}

// Bytes of scratch ``kvp_decode`` needs for B sequences whose longest past is ``max_len``.
int64_t kvp_scratch_floats(const Model* m, int B, int max_len) {
    const int qd = m->n_heads * m->head_dim, qkv = qd + 2 * m->n_kv_heads * m->head_dim;
    const int widest = std::max(std::max(m->hidden, qd), m->inter);
    const int64_t chunks = (max_len + CHUNK - 1) / CHUNK;
    return int64_t(B) * (2 * m->hidden + qd + qkv + 2 * m->inter + widest / QK + m->n_heads * (max_len + 1)) +
           int64_t(B) * m->n_kv_heads * chunks * qd / m->n_kv_heads + 64;
}

// One decode step: token ``tokens[s]`` at position ``positions[s]`` of each sequence s < B.
// k_cache[s * n_layers + l] (v_cache likewise) points at layer l's K of sequence s, laid out
// [n_kv_heads, capacity[s], head_dim]; the new K/V are written at the position, attention reads
// positions [0, position], or (layer window W > 0) [position - W + 1, position]. logits: [B, vocab]. scratch: kvp_scratch_floats(m, B, max position + 1).
// Several rows may name one sequence's cache at consecutive positions (a run of its tokens, M steps
// in one): every row's K/V is stored (rotate_and_store) before any row attends, and a row reads only
// positions up to its own, so row i sees the rows before it and none after, its arithmetic the
// single step's.
// threads: the calling thread and threads - 1 helpers (team.h), which help as they run: the result is
// the same for any number. unit_bytes: about how much work (bytes of weights or K/V read) each unit
// shared among them holds (a few microseconds' worth: more units share more evenly, each costs a
// little to hand out).
void kvp_decode(const Model* m, int B, const int64_t* tokens, const int64_t* positions, float** k_cache,
                float** v_cache, const int64_t* capacity, float* logits, float* scratch, int threads,
                int64_t unit_bytes) {
    const int H = m->hidden, D = m->head_dim, NH = m->n_heads, NKV = m->n_kv_heads, I = m->inter;
    const int QD = NH * D, KD = NKV * D;
    int max_len = 0;
    for (int s = 0; s < B; s++) max_len = positions[s] + 1 > max_len ? int(positions[s]) + 1 : max_len;
    float* x = scratch;                   // [B, H] residual stream
    float* h = x + B * H;                 // [B, H] normed, then each sublayer's output
    float* att = h + B * H;               // [B, QD] attention output
    float* qkv = att + B * QD;            // [B, QD + 2 KD]
    float* gu = qkv + B * (QD + 2 * KD);  // [B, 2 I]: gate, then up
    float* xsum = gu + B * 2 * I;         // [B, widest / 32]
    float* probs = xsum + B * (std::max(std::max(H, QD), I) / QK);  // [B, NH, max_len]
    const int chunks = (max_len + CHUNK - 1) / CHUNK;
    float* partial = probs + size_t(B) * NH * max_len;  // [B, NKV, chunks, group, D]
    const int ldq = QD + 2 * KD;
    const Step st{m, B, max_len, chunks, ldq, unit_bytes, positions, k_cache, v_cache, capacity, qkv, probs, partial, att};
    team::Team& team = team::of_this_thread();
    team.begin(threads - 1);
    embed(m, B, tokens, x);
    for (int l = 0; l < m->n_layers; l++) {
        const Layer& L = m->layers[l];
        for (int s = 0; s < B; s++) rms_norm(x + s * H, L.attn_norm, m->eps, H, h + s * H);
        {
            const Linear* ws[3] = {&L.q, &L.k, &L.v};
            float* ys[3] = {qkv, qkv + QD, qkv + QD + KD};
            const int lds[3] = {ldq, ldq, ldq};
            block_sums(ws, 3, B, h, H, xsum);
            team.run(matmul_phase(ws, ys, lds, 3, B, h, H, xsum, unit_bytes));
        }
        rotate_and_store(st, l);
        attention(team, st, l);
        matmul(team, unit_bytes, L.o, B, att, QD, xsum, h, H);
        for (int i = 0; i < B * H; i++) x[i] += h[i];
        for (int s = 0; s < B; s++) rms_norm(x + s * H, L.ffn_norm, m->eps, H, h + s * H);
        {
            const Linear* ws[2] = {&L.gate, &L.up};
            float* ys[2] = {gu, gu + I};
            const int lds[2] = {2 * I, 2 * I};
            block_sums(ws, 2, B, h, H, xsum);
            team.run(matmul_phase(ws, ys, lds, 2, B, h, H, xsum, unit_bytes));
        }
        for (int s = 0; s < B; s++) silu_mul(gu + s * 2 * I, gu + s * 2 * I + I, I);
        matmul(team, unit_bytes, L.down, B, gu, 2 * I, xsum, h, H);
        for (int i = 0; i < B * H; i++) x[i] += h[i];
    }
    for (int s = 0; s < B; s++) rms_norm(x + s * H, m->final_norm, m->eps, H, h + s * H);
    matmul(team, unit_bytes, m->head, B, h, H, xsum, logits, m->vocab);
    team.end();
}

}  // extern "C"
