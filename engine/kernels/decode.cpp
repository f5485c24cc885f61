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
// Built once per machine by engine/kernels/build.py (g++ -O3 -march=native -fopenmp); called
// through ctypes. One OpenMP parallel region per step; rows of each matrix split over threads.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <omp.h>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
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

// sum_j a[j] * b[j], lanes of 16 summed in a fixed order (n a multiple of 16 in the fast path).
inline float dot(const float* a, const float* b, int n) {
#if defined(__AVX512F__)
    if (n % 16 == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (int j = 0; j < n; j += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), acc);
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
#endif
    for (; i < n; i++) {
        v[i] = std::exp(v[i] - top);
        total += v[i];
    }
    return total;
}

// y[s][r] = W[r] . x[s] (+ bias) for rows [r0, r1) and the NB vectors x[0..NB) (stride ldx),
// written to y (stride ldy). xsum[s][b]: the sum of x[s]'s block b (Q4_1's minimum term).
template <int NB>
void rows_kernel(const Linear& W, int r0, int r1, const float* x, int ldx, const float* xsum, float* y, int ldy) {
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
        for (int s = 0; s < NB; s++) y[s * ldy + r] = out[s] + (W.bias ? W.bias[r] : 0.0f);
    }
}

// This thread's share of the rows of the matrices W[0..n), all of the same input width, applied to
// the B vectors x (inside a parallel region): matrix i's outputs go to y[i] (row stride ldy[i]).
// One split of all their rows over the threads, one barrier: q, k and v (or gate and up) are one
// pass, as one fused matrix would be.
void matmuls(const Linear* const* W, int n, int B, const float* x, int ldx, float* xsum, float* const* y,
             const int* ldy) {
    const int nb = W[0]->cols / QK;
    bool minimum = false;
    int total = 0;
    for (int i = 0; i < n; i++) {
        minimum |= W[i]->kind == Q4_1;
        total += W[i]->rows;
    }
    if (minimum) {
#pragma omp for schedule(static)
        for (int i = 0; i < B * nb; i++) {
            const float* xs = x + (i / nb) * ldx + (i % nb) * QK;
            float t = 0;
            for (int j = 0; j < QK; j++) t += xs[j];
            xsum[i] = t;
        }
    }
    const int threads = omp_get_num_threads(), me = omp_get_thread_num();
    const int per = (total + threads - 1) / threads;
    const int lo = me * per, hi = std::min(lo + per, total);
    for (int i = 0, base = 0; i < n; base += W[i]->rows, i++) {
        const int r0 = std::max(lo - base, 0), r1 = std::min(hi - base, W[i]->rows);
        for (int s = 0; s < B && r0 < r1; s += 4) {
            const float* xs = x + s * ldx;
            const float* ss = xsum + s * nb;
            float* ys = y[i] + s * ldy[i];
            switch (std::min(B - s, 4)) {
                case 1: rows_kernel<1>(*W[i], r0, r1, xs, ldx, ss, ys, ldy[i]); break;
                case 2: rows_kernel<2>(*W[i], r0, r1, xs, ldx, ss, ys, ldy[i]); break;
                case 3: rows_kernel<3>(*W[i], r0, r1, xs, ldx, ss, ys, ldy[i]); break;
                default: rows_kernel<4>(*W[i], r0, r1, xs, ldx, ss, ys, ldy[i]); break;
            }
        }
    }
#pragma omp barrier
}

void matmul(const Linear& W, int B, const float* x, int ldx, float* xsum, float* y, int ldy) {
    const Linear* ws[1] = {&W};
    float* ys[1] = {y};
    const int lds[1] = {ldy};
    matmuls(ws, 1, B, x, ldx, xsum, ys, lds);
}

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
#endif
    for (; i < n; i++) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
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

// The first position a query at position n - 1 attends to in layer L.
inline int first(const Layer& L, int n) { return L.window > 0 ? std::max(0, n - L.window) : 0; }

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
// threads: the OpenMP team's size (torch's, so the cores are shared by one team).
void kvp_decode(const Model* m, int B, const int64_t* tokens, const int64_t* positions, float** k_cache,
                float** v_cache, const int64_t* capacity, float* logits, float* scratch, int threads) {
    const int H = m->hidden, D = m->head_dim, NH = m->n_heads, NKV = m->n_kv_heads, I = m->inter;
    const int QD = NH * D, KD = NKV * D, group = NH / NKV;
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

#pragma omp parallel num_threads(threads)
    {
        // embeddings
#pragma omp for schedule(static)
        for (int s = 0; s < B; s++) {
            const Linear& E = m->embed;
            float* out = x + s * H;
            if (E.kind == F32) {
                std::memcpy(out, static_cast<const float*>(E.data) + size_t(tokens[s]) * H, sizeof(float) * H);
            } else {
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
        for (int l = 0; l < m->n_layers; l++) {
            const Layer& L = m->layers[l];
#pragma omp for schedule(static)
            for (int s = 0; s < B; s++) rms_norm(x + s * H, L.attn_norm, m->eps, H, h + s * H);
            {
                const Linear* ws[3] = {&L.q, &L.k, &L.v};
                float* ys[3] = {qkv, qkv + QD, qkv + QD + KD};
                const int lds[3] = {ldq, ldq, ldq};
                matmuls(ws, 3, B, h, H, xsum, ys, lds);
            }
            // per-head norms (Qwen3), rotary, and the new K/V into the caches
#pragma omp for schedule(static)
            for (int s = 0; s < B; s++) {
                float* q = qkv + s * ldq;
                float* k = q + QD;
                float* v = k + KD;
                const int64_t pos = positions[s];
                const float* cs = m->cos_table + pos * D;
                const float* sn = m->sin_table + pos * D;
                for (int hh = 0; hh < NH; hh++) {
                    if (L.q_norm) rms_norm(q + hh * D, L.q_norm, m->eps, D, q + hh * D);
                    rope(q + hh * D, cs, sn, D);
                }
                float* kc = k_cache[s * m->n_layers + l];
                float* vc = v_cache[s * m->n_layers + l];
                for (int hh = 0; hh < NKV; hh++) {
                    if (L.k_norm) rms_norm(k + hh * D, L.k_norm, m->eps, D, k + hh * D);
                    rope(k + hh * D, cs, sn, D);
                    std::memcpy(kc + (size_t(hh) * capacity[s] + pos) * D, k + hh * D, sizeof(float) * D);
                    std::memcpy(vc + (size_t(hh) * capacity[s] + pos) * D, v + hh * D, sizeof(float) * D);
                }
            }
            // attention, in four passes over (sequence, K/V head, chunk of CHUNK positions): each
            // position's K and V read once for the heads sharing them, the work split evenly
            // however few sequences run; every sum in a fixed order (chunk by chunk)
#pragma omp for schedule(static)
            for (int i = 0; i < B * NKV * chunks; i++) {
                const int s = i / (NKV * chunks), kvh = (i / chunks) % NKV, c = i % chunks;
                const int n = int(positions[s]) + 1, t1 = std::min(n, c * CHUNK + CHUNK);
                const int t0 = std::max(c * CHUNK, first(L, n));
                const float* kc = k_cache[s * m->n_layers + l] + size_t(kvh) * capacity[s] * D;
                for (int t = t0; t < t1; t++)
                    for (int g = 0; g < group; g++) {
                        const int hh = kvh * group + g;
                        probs[size_t(s * NH + hh) * max_len + t] = dot(qkv + s * ldq + hh * D, kc + size_t(t) * D, D) * m->scale;
                    }
            }
#pragma omp for schedule(static)
            for (int i = 0; i < B * NH; i++) {
                const int n = int(positions[i / NH]) + 1, t0 = first(L, n);
                float* p = probs + size_t(i) * max_len;
                float top = -INFINITY;
                for (int t = t0; t < n; t++) top = p[t] > top ? p[t] : top;
                const float inv = 1.0f / exp_shifted(p + t0, n - t0, top);
                for (int t = t0; t < n; t++) p[t] *= inv;
            }
#pragma omp for schedule(static)
            for (int i = 0; i < B * NKV * chunks; i++) {
                const int s = i / (NKV * chunks), kvh = (i / chunks) % NKV, c = i % chunks;
                const int n = int(positions[s]) + 1, t1 = std::min(n, c * CHUNK + CHUNK);
                const int t0 = std::max(c * CHUNK, first(L, n));
                const float* vc = v_cache[s * m->n_layers + l] + size_t(kvh) * capacity[s] * D;
                float* part = partial + size_t(i) * group * D;
                for (int j = 0; j < group * D; j++) part[j] = 0;
                for (int t = t0; t < t1; t++)
                    for (int g = 0; g < group; g++)
                        axpy(probs[size_t(s * NH + kvh * group + g) * max_len + t], vc + size_t(t) * D, part + g * D, D);
            }
#pragma omp for schedule(static)
            for (int i = 0; i < B * NH; i++) {
                const int s = i / NH, hh = i % NH, kvh = hh / group, g = hh % group;
                float* out = att + s * QD + hh * D;
                for (int j = 0; j < D; j++) out[j] = 0;
                for (int c = 0; c < chunks; c++)
                    axpy(1.0f, partial + (size_t((s * NKV + kvh) * chunks + c) * group + g) * D, out, D);
            }
            matmul(L.o, B, att, QD, xsum, h, H);
#pragma omp for schedule(static)
            for (int i = 0; i < B * H; i++) x[i] += h[i];
#pragma omp for schedule(static)
            for (int s = 0; s < B; s++) rms_norm(x + s * H, L.ffn_norm, m->eps, H, h + s * H);
            {
                const Linear* ws[2] = {&L.gate, &L.up};
                float* ys[2] = {gu, gu + I};
                const int lds[2] = {2 * I, 2 * I};
                matmuls(ws, 2, B, h, H, xsum, ys, lds);
            }
#pragma omp for schedule(static)
            for (int s = 0; s < B; s++) {
                float* g = gu + s * 2 * I;
                silu_mul(g, g + I, I);
            }
            matmul(L.down, B, gu, 2 * I, xsum, h, H);
#pragma omp for schedule(static)
            for (int i = 0; i < B * H; i++) x[i] += h[i];
        }
#pragma omp for schedule(static)
        for (int s = 0; s < B; s++) rms_norm(x + s * H, m->final_norm, m->eps, H, h + s * H);
        matmul(m->head, B, h, H, xsum, logits, m->vocab);
    }
}

}  // extern "C"
