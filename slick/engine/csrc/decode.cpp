// slick native decode kernels (CPU): RMSNorm, and RoPE + KV write + attention for one decode step.
//
// Built on first use by slick/engine/native.py (`c++ -O3 -march=native -fopenmp -shared`) and loaded with
// ctypes. It links libgomp.so.1, which resolves to the OpenMP runtime torch has already loaded, so these loops
// share torch's thread team. Every kernel exists for fp32 (suffix _f32) and bf16 (_bf16) storage; arithmetic
// is fp32, and bf16 results are rounded where the PyTorch reference path rounds them.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

struct BF16 { uint16_t bits; };

inline float load(float x) { return x; }
inline float load(BF16 x) { uint32_t u = uint32_t(x.bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
template <class T> inline T store(float f);
template <> inline float store<float>(float f) { return f; }
template <> inline BF16 store<BF16>(float f) {  // round to nearest even; NaN stays NaN
    uint32_t u; std::memcpy(&u, &f, 4);
    if (f != f) return BF16{0x7FC0};
    return BF16{uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
template <class T> inline float round_to(float f) { return load(store<T>(f)); }

// RMSNorm of one row: out = round(round(x * rsqrt(mean(x^2) + eps)) * w)  (HF order).
template <class T>
void rmsnorm(const T* x, const T* w, T* out, int64_t rows, int64_t H, int64_t xs, float eps, int nt) {
#pragma omp parallel for if (rows >= 64) schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) {
        const T* xr = x + r * xs;
        T* o = out + r * H;
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < H; i++) { float v = load(xr[i]); ss += v * v; }
        const float s = 1.0f / std::sqrt(ss / float(H) + eps);
#pragma omp simd
        for (int64_t i = 0; i < H; i++) o[i] = store<T>(round_to<T>(load(xr[i]) * s) * load(w[i]));
    }
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

// One (sequence, kv head) of a decode step; HD is the head size (a compile-time constant, so every inner loop
// is a few fully unrolled vector instructions).
template <class T, int64_t HD>
inline void attn_task(const T* src, int64_t nh, int64_t nkv, int64_t g, int64_t h, int64_t p, const T* c,
                      const T* s, T* kc, T* vc, T* o, float scale) {
    constexpr int64_t half = HD / 2;
    const T* k = src + (nh + h) * HD;
    const T* v = src + (nh + nkv + h) * HD;
    for (int64_t d = 0; d < HD; d++) {
        const float rolled = load(k[d < half ? d + half : d - half]);
        kc[p * HD + d] = store<T>(round_to<T>(load(k[d]) * load(c[d])) + rolled * load(s[d]));
        vc[p * HD + d] = v[d];
    }
    alignas(64) float q[MAXG][HD], acc[MAXG][HD], sc[MAXG][CH], kf[HD];
    float m[MAXG], l[MAXG];
    for (int64_t j = 0; j < g; j++) {
        const T* qj = src + (h * g + j) * HD;
        for (int64_t d = 0; d < HD; d++) {
            const float rolled = load(qj[d < half ? d + half : d - half]);
            q[j][d] = round_to<T>(round_to<T>(load(qj[d]) * load(c[d])) + rolled * load(s[d])) * scale;
            acc[j][d] = 0.f;
        }
        m[j] = -INFINITY;
        l[j] = 0.f;
    }
    for (int64_t t0 = 0; t0 <= p; t0 += CH) {  // CH positions at a time, running max across chunks
        const int64_t n = (p + 1 - t0) < CH ? (p + 1 - t0) : CH;
        for (int64_t t = 0; t < n; t++) {  // scores: each K row read once for the g query heads
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
        for (int64_t j = 0; j < g; j++) {  // softmax numerators, rescaling what came before
            float mx = m[j];
            for (int64_t t = 0; t < n; t++) mx = sc[j][t] > mx ? sc[j][t] : mx;
            if (mx > m[j]) {
                const float f = exp_neg(m[j] - mx);
                l[j] *= f;
#pragma omp simd
                for (int64_t d = 0; d < HD; d++) acc[j][d] *= f;
                m[j] = mx;
            }
            float sum = 0.f;
#pragma omp simd reduction(+ : sum)
            for (int64_t t = 0; t < n; t++) { sc[j][t] = exp_neg(sc[j][t] - mx); sum += sc[j][t]; }
            l[j] += sum;
        }
        for (int64_t t = 0; t < n; t++) {  // weighted sum of V rows, each read once
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
        T* oj = o + (h * g + j) * HD;
#pragma omp simd
        for (int64_t d = 0; d < HD; d++) oj[d] = store<T>(acc[j][d] * inv);
    }
}

// One decode step for B sequences in KV slots 0..B-1. qkv: [B, nh + 2*nkv, hd] (row stride qs), the fresh
// q/k/v of each sequence's token at position pos[b]. Per (b, kv head): RoPE (x*cos + roll(x, hd/2)*sin_signed,
// table row pos[b]) on k and on the g = nh/nkv query heads of the group, k and v written to the caches at
// [b, h, pos[b]], then attention over positions 0..pos[b]. Caches [slots, nkv, cap, hd]; out [B, nh*hd].
template <class T, int64_t HD>
void decode_attn(const T* qkv, int64_t qs, int64_t B, int64_t nh, int64_t nkv, const T* cos, const T* sin,
                 const int64_t* pos, T* kcache, T* vcache, int64_t cap, T* out, float scale, int nt) {
    const int64_t g = nh / nkv;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < nkv; h++)
            attn_task<T, HD>(qkv + b * qs, nh, nkv, g, h, pos[b], cos + pos[b] * HD, sin + pos[b] * HD,
                             kcache + (b * nkv + h) * cap * HD, vcache + (b * nkv + h) * cap * HD,
                             out + b * nh * HD, scale);
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
int decode_attn_bf16(const BF16* qkv, int64_t qs, int64_t B, int64_t nh, int64_t nkv, int64_t hd, const BF16* cos,
                     const BF16* sin, const int64_t* pos, BF16* kc, BF16* vc, int64_t cap, BF16* out, float scale,
                     int nt) {
    return decode_attn_any<BF16>(qkv, qs, B, nh, nkv, hd, cos, sin, pos, kc, vc, cap, out, scale, nt);
}
}
