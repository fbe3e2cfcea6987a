// slick native decode kernels (CPU): RMSNorm, and RoPE + KV write + attention for one decode step.
//
// Built on first use by slick/engine/native.py (`c++ -O3 -march=native -fopenmp -shared`) and loaded with
// ctypes. It links libgomp.so.1, which resolves to the OpenMP runtime torch has already loaded, so these loops
// share torch's thread team. Every kernel exists for fp32 (suffix _f32) and bf16 (_bf16) storage; arithmetic
// is fp32, and bf16 results are rounded where the PyTorch reference path rounds them.
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

struct BF16 { uint16_t bits; };

inline float load(float x) { return x; }
inline float load(BF16 x) { uint32_t u = uint32_t(x.bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
template <class T> inline T store(float f);
template <> inline float store<float>(float f) { return f; }
template <> inline BF16 store<BF16>(float f) {  // round to nearest even; NaN stays NaN (branch-free)
    uint32_t u; std::memcpy(&u, &f, 4);
    const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return BF16{uint16_t(f != f ? 0x7FC0u : r)};
}
template <class T> inline float round_to(float f) { return load(store<T>(f)); }

#if defined(__AVX512F__)
inline __m512 ld16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 ld16(const BF16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// e^x for x <= 0, 16 lanes: the same reduction and polynomial as exp_neg, 2^n applied with vscalefps.
inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#elif defined(__AVX2__) && defined(__FMA__)
inline __m256 ld8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 ld8(const BF16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// e^x for x <= 0, 8 lanes: exp_neg's reduction and polynomial; 2^n built in the exponent bits, as exp_neg does.
inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif
#if defined(__AVX512F__) && defined(__AVX512BF16__)
inline __m512 bf16_round16(__m512 v) {  // round 16 floats through bf16 (nearest even)
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

// RMSNorm of one row: out = round(round(x * rsqrt(mean(x^2) + eps)) * w)  (HF order).
template <class T>
inline void rmsnorm_row(const T* xr, const T* w, T* o, int64_t H, float eps) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if constexpr (sizeof(T) == 2) {
        if (H % 16 == 0) {  // 16 lanes at a time; bf16 rounding with vcvtneps2bf16 (nearest even, NaN kept)
            __m512 acc = _mm512_setzero_ps();
            for (int64_t i = 0; i < H; i += 16) { const __m512 v = ld16(xr + i); acc = _mm512_fmadd_ps(v, v, acc); }
            const __m512 sv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / float(H) + eps));
            for (int64_t i = 0; i < H; i += 16) {
                const __m512 y = bf16_round16(_mm512_mul_ps(ld16(xr + i), sv));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(y, ld16(w + i))));
            }
            return;
        }
    }
#endif
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < H; i++) { float v = load(xr[i]); ss += v * v; }
    const float s = 1.0f / std::sqrt(ss / float(H) + eps);
#pragma omp simd
    for (int64_t i = 0; i < H; i++) o[i] = store<T>(round_to<T>(load(xr[i]) * s) * load(w[i]));
}

template <class T>
void rmsnorm(const T* x, const T* w, T* out, int64_t rows, int64_t H, int64_t xs, float eps, int nt) {
#pragma omp parallel for if (rows * H >= (1 << 16)) schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) rmsnorm_row<T>(x + r * xs, w, out + r * H, H, eps);
}

// e^x for x <= 0 (scores minus their max): Cody-Waite reduction and a degree-6 polynomial, ~1 ulp. Plain
// arithmetic, so the compiler vectorises it (libm's expf is a scalar call).
inline float exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = std::floor(x * 1.44269504088896341f + 0.5f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const uint32_t e = uint32_t(int32_t(n) + 127) << 23;
    float two_n; std::memcpy(&two_n, &e, 4);
    return p * two_n;
}

constexpr int64_t MAXG = 16, CH = 128;

// RoPE of one head (rotate-half form): out = round(round(x*c) + roll(x, HD/2)*s), as fp32. Two half loops
// instead of a wrapped index, so both vectorise.
template <class T, int64_t HD>
inline void rope(const T* x, const T* c, const T* s, float* out) {
    constexpr int64_t half = HD / 2;
#pragma omp simd
    for (int64_t d = 0; d < half; d++)
        out[d] = round_to<T>(round_to<T>(load(x[d]) * load(c[d])) + load(x[d + half]) * load(s[d]));
#pragma omp simd
    for (int64_t d = half; d < HD; d++)
        out[d] = round_to<T>(round_to<T>(load(x[d]) * load(c[d])) + load(x[d - half]) * load(s[d]));
}


// Attention of g query heads q[j] (fp32, pre-scaled) over positions 0..p of one head's cache rows kc/vc;
// writes round(softmax(q.K) V) to o[j*HD ..]. CH positions at a time (scores, then numerators with a running
// max, then the value sum), so each K and V row is read once for all g heads.
template <class T, int64_t HD>
inline void attend(const float (*q)[HD], int64_t g, int64_t p, const T* kc, const T* vc, T* o) {
    alignas(64) float acc[MAXG][HD], sc[MAXG][CH];
    float m[MAXG], l[MAXG];
    for (int64_t j = 0; j < g; j++) {
        m[j] = -INFINITY;
        l[j] = 0.f;
        for (int64_t d = 0; d < HD; d++) acc[j][d] = 0.f;
    }
    for (int64_t t0 = 0; t0 <= p; t0 += CH) {
        const int64_t n = (p + 1 - t0) < CH ? (p + 1 - t0) : CH;
#if defined(__AVX512F__)
        if constexpr (HD % 16 == 0) {
            constexpr int64_t NV = HD / 16;
            for (int64_t t = 0; t < n; t++) {
                const T* kt = kc + (t0 + t) * HD;
                __m512 kv[NV];
                for (int64_t i = 0; i < NV; i++) kv[i] = ld16(kt + 16 * i);
                for (int64_t j = 0; j < g; j++) {
                    __m512 a = _mm512_mul_ps(_mm512_load_ps(q[j]), kv[0]);
                    for (int64_t i = 1; i < NV; i++) a = _mm512_fmadd_ps(_mm512_load_ps(q[j] + 16 * i), kv[i], a);
                    sc[j][t] = _mm512_reduce_add_ps(a);
                }
            }
            for (int64_t j = 0; j < g; j++) {
                __m512 mv = _mm512_set1_ps(m[j]);
                for (int64_t t = 0; t < n; t += 16) {
                    const __mmask16 k = n - t >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - t)) - 1);
                    mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, sc[j] + t));
                }
                const float mx = _mm512_reduce_max_ps(mv);
                if (mx > m[j]) {
                    const float f = exp_neg(m[j] - mx);
                    l[j] *= f;
                    for (int64_t d = 0; d < HD; d++) acc[j][d] *= f;
                    m[j] = mx;
                }
                __m512 sum = _mm512_setzero_ps();
                for (int64_t t = 0; t < n; t += 16) {
                    const __mmask16 k = n - t >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - t)) - 1);
                    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sc[j] + t), _mm512_set1_ps(mx)));
                    _mm512_mask_storeu_ps(sc[j] + t, k, e);
                    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
                }
                l[j] += _mm512_reduce_add_ps(sum);
            }
            for (int64_t t = 0; t < n; t++) {
                const T* vt = vc + (t0 + t) * HD;
                __m512 vv[NV];
                for (int64_t i = 0; i < NV; i++) vv[i] = ld16(vt + 16 * i);
                for (int64_t j = 0; j < g; j++) {
                    const __m512 e = _mm512_set1_ps(sc[j][t]);
                    for (int64_t i = 0; i < NV; i++)
                        _mm512_store_ps(acc[j] + 16 * i, _mm512_fmadd_ps(e, vv[i], _mm512_load_ps(acc[j] + 16 * i)));
                }
            }
            continue;
        }
#endif
        alignas(64) float kf[HD];
        for (int64_t t = 0; t < n; t++) {  // scores
            const T* kt = kc + (t0 + t) * HD;
#pragma omp simd
            for (int64_t d = 0; d < HD; d++) kf[d] = load(kt[d]);
            for (int64_t j = 0; j < g; j++) {
                float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < HD; d++) dot += q[j][d] * kf[d];
                sc[j][t] = dot;
            }
        }
        for (int64_t j = 0; j < g; j++) {  // numerators, rescaling what came before
            float mx = m[j];
            for (int64_t t = 0; t < n; t++) mx = sc[j][t] > mx ? sc[j][t] : mx;
            if (mx > m[j]) {
                const float f = exp_neg(m[j] - mx);
                l[j] *= f;
                for (int64_t d = 0; d < HD; d++) acc[j][d] *= f;
                m[j] = mx;
            }
            float sum = 0.f;
            for (int64_t t = 0; t < n; t++) { sc[j][t] = exp_neg(sc[j][t] - mx); sum += sc[j][t]; }
            l[j] += sum;
        }
        for (int64_t t = 0; t < n; t++) {  // value sum
            const T* vt = vc + (t0 + t) * HD;
#pragma omp simd
            for (int64_t d = 0; d < HD; d++) kf[d] = load(vt[d]);
            for (int64_t j = 0; j < g; j++) {
                const float e = sc[j][t];
#pragma omp simd
                for (int64_t d = 0; d < HD; d++) acc[j][d] += e * kf[d];
            }
        }
    }
    for (int64_t j = 0; j < g; j++) {
        const float inv = 1.f / l[j];
#pragma omp simd
        for (int64_t d = 0; d < HD; d++) o[j * HD + d] = store<T>(acc[j][d] * inv);
    }
}

// One (sequence, kv head) of a decode step: RoPE on k and on the group's g query heads, k and v written at
// position p, then attention. HD is a compile-time constant so every inner loop is fully unrolled.
template <class T, int64_t HD>
inline void attn_task(const T* src, int64_t nh, int64_t nkv, int64_t g, int64_t h, int64_t p, const T* c,
                      const T* s, T* kc, T* vc, T* o, float scale) {
    alignas(64) float q[MAXG][HD], kr[HD];
    rope<T, HD>(src + (nh + h) * HD, c, s, kr);
    const T* v = src + (nh + nkv + h) * HD;
#pragma omp simd
    for (int64_t d = 0; d < HD; d++) {
        kc[p * HD + d] = store<T>(kr[d]);
        vc[p * HD + d] = v[d];
    }
    for (int64_t j = 0; j < g; j++) {
        rope<T, HD>(src + (h * g + j) * HD, c, s, q[j]);
#pragma omp simd
        for (int64_t d = 0; d < HD; d++) q[j][d] *= scale;
    }
    attend<T, HD>(q, g, p, kc, vc, o + h * g * HD);
}

// One decode step for B sequences in KV slots 0..B-1. qkv: [B, nh + 2*nkv, hd] (row stride qs), the fresh
// q/k/v of each sequence's token at position pos[b]. Per (b, kv head): RoPE (x*cos + roll(x, hd/2)*sin_signed,
// table row pos[b]) on k and on the g = nh/nkv query heads of the group, k and v written to the caches at
// [b, h, pos[b]], then attention over positions 0..pos[b]. Caches [slots, nkv, cap, hd]; out [B, nh*hd].
template <class T, int64_t HD>
void decode_attn(const T* qkv, int64_t qs, int64_t B, int64_t nh, int64_t nkv, const T* cos, const T* sin,
                 const int64_t* pos, T* kcache, T* vcache, int64_t cap, T* out, float scale, int nt) {
    const int64_t g = nh / nkv;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < B * nkv; i++) {  // task i = (sequence i / nkv, kv head i % nkv)
        const int64_t b = i / nkv, h = i % nkv;
#if defined(__AVX512F__)
        if (i + 1 < B * nkv) {  // start fetching the next task's first keys and values into L2
            const int64_t n = pos[(i + 1) / nkv] + 1, bytes = (n < CH ? n : CH) * HD * int64_t(sizeof(T));
            const char* kn = reinterpret_cast<const char*>(kcache + (i + 1) * cap * HD);
            const char* vn = reinterpret_cast<const char*>(vcache + (i + 1) * cap * HD);
            for (int64_t o = 0; o < bytes; o += 64) {
                _mm_prefetch(kn + o, _MM_HINT_T1);
                _mm_prefetch(vn + o, _MM_HINT_T1);
            }
        }
#endif
        attn_task<T, HD>(qkv + b * qs, nh, nkv, g, h, pos[b], cos + pos[b] * HD, sin + pos[b] * HD,
                         kcache + i * cap * HD, vcache + i * cap * HD, out + b * nh * HD, scale);
    }
}

template <class T>
int decode_attn_any(const T* qkv, int64_t qs, int64_t B, int64_t nh, int64_t nkv, int64_t hd, const T* cos,
                    const T* sin, const int64_t* pos, T* kc, T* vc, int64_t cap, T* out, float scale, int nt) {
    if (nh % nkv != 0 || nh / nkv > MAXG) return 1;
    switch (hd) {
        case 64: decode_attn<T, 64>(qkv, qs, B, nh, nkv, cos, sin, pos, kc, vc, cap, out, scale, nt); return 0;
        case 128: decode_attn<T, 128>(qkv, qs, B, nh, nkv, cos, sin, pos, kc, vc, cap, out, scale, nt); return 0;
        case 256: decode_attn<T, 256>(qkv, qs, B, nh, nkv, cos, sin, pos, kc, vc, cap, out, scale, nt); return 0;
        case 32: decode_attn<T, 32>(qkv, qs, B, nh, nkv, cos, sin, pos, kc, vc, cap, out, scale, nt); return 0;
        case 16: decode_attn<T, 16>(qkv, qs, B, nh, nkv, cos, sin, pos, kc, vc, cap, out, scale, nt); return 0;
        default: return 2;
    }
}

// Sampling for rows without top-k/top-p: per row b, z = x * inv_t[b] (inv_t = 0: greedy, z = x). Picks the
// first token whose running sum of exp(z - max) exceeds u[b] * total (greedy: the first maximum) and returns
// its logprob z[tok] - logsumexp(z). Block sums of 16 make the search one pass over V/16 numbers.
template <class T>
void sample_rows(const T* logits, int64_t B, int64_t V, const float* inv_t, const float* u, int64_t* tok, float* lp,
                 int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t b = 0; b < B; b++) {
        const T* x = logits + b * V;
        const bool greedy = inv_t[b] <= 0.f;
        const float it = greedy ? 1.f : inv_t[b];
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t i = 0; i < V; i++) {   // fmax would be a libm call per element; NaN is skipped the same way
            const float v = load(x[i]);
            mx = v > mx ? v : mx;
        }
        const float m = mx * it;
        const int64_t nb = (V + 15) / 16;
        float* blk = new float[nb];
        double total = 0.0;
        for (int64_t k = 0; k < nb; k++) {
            const int64_t e = (k + 1) * 16 < V ? (k + 1) * 16 : V;
            float sum = 0.f;
#if defined(__AVX512F__)
            if (e - k * 16 == 16) {
                const __m512 z = _mm512_fmsub_ps(ld16(x + k * 16), _mm512_set1_ps(it), _mm512_set1_ps(m));
                sum = _mm512_reduce_add_ps(exp16(z));
            } else
#elif defined(__AVX2__) && defined(__FMA__)
            if (e - k * 16 == 16) {
                const __m256 iv = _mm256_set1_ps(it), mv = _mm256_set1_ps(m);
                sum = hsum8(_mm256_add_ps(exp8(_mm256_fmsub_ps(ld8(x + k * 16), iv, mv)),
                                          exp8(_mm256_fmsub_ps(ld8(x + k * 16 + 8), iv, mv))));
            } else
#endif
                for (int64_t i = k * 16; i < e; i++) sum += exp_neg(load(x[i]) * it - m);
            blk[k] = sum;
            total += sum;
        }
        int64_t pick = -1;
        if (greedy) {
            for (int64_t i = 0; i < V && pick < 0; i++)
                if (load(x[i]) == mx) pick = i;
        } else {
            const double target = double(u[b]) * total;
            double run = 0.0;
            int64_t k = 0;
            while (k < nb && run + blk[k] <= target) run += blk[k++];
            for (int64_t i = k * 16; k < nb && i < ((k + 1) * 16 < V ? (k + 1) * 16 : V); i++) {
                run += exp_neg(load(x[i]) * it - m);
                if (run > target) { pick = i; break; }
            }
            for (int64_t i = V - 1; pick < 0 && i >= 0; i--)  // rounding left the target unreached:
                if (exp_neg(load(x[i]) * it - m) > 0.f) pick = i;  // the last token with mass
        }
        delete[] blk;
        if (pick < 0) pick = 0;  // only for NaN logits: keep the read in bounds
        tok[b] = pick;
        lp[b] = load(x[pick]) * it - m - float(std::log(total));
    }
}

}  // namespace

extern "C" {
int slick_attn_supported(int64_t nh, int64_t nkv, int64_t hd) {
    return nkv > 0 && nh % nkv == 0 && nh / nkv <= MAXG && (hd == 16 || hd == 32 || hd == 64 || hd == 128 || hd == 256);
}
void rmsnorm_f32(const float* x, const float* w, float* out, int64_t rows, int64_t H, int64_t xs, float eps, int nt) {
    rmsnorm<float>(x, w, out, rows, H, xs, eps, nt);
}
void rmsnorm_bf16(const BF16* x, const BF16* w, BF16* out, int64_t rows, int64_t H, int64_t xs, float eps, int nt) {
    rmsnorm<BF16>(x, w, out, rows, H, xs, eps, nt);
}
int decode_attn_f32(const float* qkv, int64_t qs, int64_t B, int64_t nh, int64_t nkv, int64_t hd, const float* cos,
                    const float* sin, const int64_t* pos, float* kc, float* vc, int64_t cap, float* out, float scale,
                    int nt) {
    return decode_attn_any<float>(qkv, qs, B, nh, nkv, hd, cos, sin, pos, kc, vc, cap, out, scale, nt);
}
void sample_f32(const float* x, int64_t B, int64_t V, const float* inv_t, const float* u, int64_t* tok, float* lp,
                int nt) {
    sample_rows<float>(x, B, V, inv_t, u, tok, lp, nt);
}
void sample_bf16(const BF16* x, int64_t B, int64_t V, const float* inv_t, const float* u, int64_t* tok, float* lp,
                 int nt) {
    sample_rows<BF16>(x, B, V, inv_t, u, tok, lp, nt);
}
int decode_attn_bf16(const BF16* qkv, int64_t qs, int64_t B, int64_t nh, int64_t nkv, int64_t hd, const BF16* cos,
                     const BF16* sin, const int64_t* pos, BF16* kc, BF16* vc, int64_t cap, BF16* out, float scale,
                     int nt) {
    return decode_attn_any<BF16>(qkv, qs, B, nh, nkv, hd, cos, sin, pos, kc, vc, cap, out, scale, nt);
}
}
