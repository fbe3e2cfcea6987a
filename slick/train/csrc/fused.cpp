// The trainer's elementwise work around its bf16 matmuls in one pass over memory per call
// (slick/train/native_fused.py): RMSNorm forward and backward, rotate-half RoPE forward and backward, the SwiGLU
// product forward and backward, and the token logprobs and entropy of a chunk of logits with their gradient.
//
// RMSNorm: slick.train.fused_layers.rms_norm / rms_norm_backward for an fp32 residual stream, in fp32:
//   forward:  r = 1 / sqrt(mean(x^2) + eps);  out = bf16(w * (x * r))           (round to nearest even)
//   backward: xhat = x * r;  g = dy * w;  dx = r * (g - xhat * mean(g * xhat));  dw = sum over rows of dy * xhat
// Rows are split over the OpenMP team (the one torch has loaded: libgomp); dw is summed per thread and then over
// the threads in their order, so a given thread count gives the same bits every time.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {   // nearest even; NaN stays NaN (branch-free: the loop vectorizes)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(f != f ? 0x7FC0u : r);
}

extern "C" void rmsnorm_fwd(const float* x, const float* w, uint16_t* out, float* r, int64_t rows, int64_t H,
                            float eps, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < rows; ++i) {
        const float* __restrict__ xr = x + i * H;
        uint16_t* __restrict__ o = out + i * H;
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < H; ++j) ss += xr[j] * xr[j];
        const float s = 1.0f / std::sqrt(ss / (float)H + eps);
        r[i] = s;
#pragma omp simd
        for (int64_t j = 0; j < H; ++j) o[j] = f32_to_bf16(w[j] * (xr[j] * s));
    }
}

extern "C" void rmsnorm_bwd(const float* x, const float* w, const float* r, const uint16_t* dy, float* dx, float* dw,
                            int64_t rows, int64_t H, int nt) {
    std::vector<float> part((size_t)nt * (size_t)H, 0.f);   // each thread's share of dw
#pragma omp parallel num_threads(nt)
    {
        float* __restrict__ pw = part.data() + (size_t)omp_get_thread_num() * (size_t)H;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < rows; ++i) {
            const float* __restrict__ xr = x + i * H;
            const uint16_t* __restrict__ gr = dy + i * H;
            float* __restrict__ o = dx + i * H;
            const float s = r[i];
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t j = 0; j < H; ++j) {
                const float xh = xr[j] * s, g = bf16_to_f32(gr[j]);
                dot += g * w[j] * xh;
                pw[j] += g * xh;
            }
            const float m = dot / (float)H;
#pragma omp simd
            for (int64_t j = 0; j < H; ++j) o[j] = s * (bf16_to_f32(gr[j]) * w[j] - xr[j] * s * m);
        }
    }
    for (int64_t j = 0; j < H; ++j) {
        float acc = 0.f;
        for (int t = 0; t < nt; ++t) acc += part[(size_t)t * (size_t)H + (size_t)j];
        dw[j] = acc;
    }
}

// e^x for x in [-87, 88] (clamped there): Cody-Waite reduction by ln 2 and a degree-6 polynomial (Cephes' expf),
// 2^n put into the exponent bits; within 2 ulp of expf, and plain arithmetic, so the loops that call it vectorize.
static inline float exp_f(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = std::nearbyint(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t e = ((int32_t)n + 127) << 23;
    float two_n;
    std::memcpy(&two_n, &e, 4);
    return p * two_n;
}

// Logprobs of one chunk (slick.train.logprobs.FusedLogprobEntropy), from its logits z [rows, V] in bf16 (the lm
// head's matmul output) and the inverse temperature t: with y = z * t and lse = log sum exp y,
//   lse[i], lp[i] = y[target] - lse, ent[i] = -sum p log p = log s - sum e (y - m) / s  (m = max y, e = exp(y - m),
//   s = sum e; ent may be null).
extern "C" void logprob_fwd(const uint16_t* z, const int64_t* target, float t, int64_t rows, int64_t V, float* lse,
                            float* lp, float* ent, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < rows; ++i) {
        const uint16_t* __restrict__ zr = z + i * V;
        float m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (int64_t v = 0; v < V; ++v) {
            const float y = bf16_to_f32(zr[v]) * t;
            m = y > m ? y : m;
        }
        float s = 0.f, d = 0.f;
#pragma omp simd reduction(+ : s, d)
        for (int64_t v = 0; v < V; ++v) {
            const float y = bf16_to_f32(zr[v]) * t - m, e = exp_f(y);
            s += e;
            d += e * y;
        }
        const float ls = std::log(s);
        lse[i] = m + ls;
        lp[i] = bf16_to_f32(zr[target[i]]) * t - lse[i];
        if (ent != nullptr) ent[i] = ls - d / s;
    }
}

// d loss / d z of one chunk, in bf16 into dz [rows, V] (rows of the caller's buffer): with lp_v = y_v - lse and
// p_v = exp(lp_v),  dz_v = t * (-p_v * (g_lp + g_ent * (lp_v + ent)) + g_lp * [v == target])  (g_ent, ent null: no
// entropy term; g_lp null: no logprob term), the order FusedLogprobEntropy.backward computes it in.
extern "C" void logprob_bwd(const uint16_t* z, const int64_t* target, float t, int64_t rows, int64_t V,
                            const float* lse, const float* ent, const float* g_lp, const float* g_ent, uint16_t* dz,
                            int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < rows; ++i) {
        const uint16_t* __restrict__ zr = z + i * V;
        uint16_t* __restrict__ o = dz + i * V;
        const float l = lse[i], gl = g_lp != nullptr ? g_lp[i] : 0.f;
        const float ge = g_ent != nullptr ? g_ent[i] : 0.f, en = g_ent != nullptr ? ent[i] : 0.f;
        if (g_ent != nullptr) {
#pragma omp simd
            for (int64_t v = 0; v < V; ++v) {
                const float q = bf16_to_f32(zr[v]) * t - l;
                o[v] = f32_to_bf16(-((q + en) * ge + gl) * exp_f(q) * t);
            }
        } else {
#pragma omp simd
            for (int64_t v = 0; v < V; ++v) {
                const float q = bf16_to_f32(zr[v]) * t - l;
                o[v] = f32_to_bf16(-(exp_f(q) * gl) * t);
            }
        }
        if (g_lp != nullptr) {   // the target's one-hot term, added before the temperature as the torch path does
            const int64_t v = target[i];
            const float q = bf16_to_f32(zr[v]) * t - l;
            const float base = g_ent != nullptr ? -((q + en) * ge + gl) * exp_f(q) : -(exp_f(q) * gl);
            o[v] = f32_to_bf16((base + gl) * t);
        }
    }
}

// SwiGLU of the MLP (slick.train.fused_layers.mlp_forward / mlp_backward) on the gate/up product gu [rows, 2I] in
// bf16 (gate columns first), rounded to bf16 where torch's bf16 kernels round:
//   forward:  h = bf16(bf16(silu(g)) * u),  silu(g) = g / (1 + e^-g)
//   backward: also du = bf16(da * bf16(silu(g))) and dg = bf16(bf16(da * u) * s * (1 + g * (1 - s))), s = 1 / (1 + e^-g),
//             into dgu [rows, 2I] (dg columns first)
extern "C" void swiglu_fwd(const uint16_t* gu, int64_t rows, int64_t I, uint16_t* h, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < rows; ++i) {
        const uint16_t* __restrict__ g = gu + i * 2 * I;
        const uint16_t* __restrict__ u = g + I;
        uint16_t* __restrict__ o = h + i * I;
#pragma omp simd
        for (int64_t j = 0; j < I; ++j) {
            const float gf = bf16_to_f32(g[j]);
            o[j] = f32_to_bf16(bf16_to_f32(f32_to_bf16(gf / (1.0f + exp_f(-gf)))) * bf16_to_f32(u[j]));
        }
    }
}

extern "C" void swiglu_bwd(const uint16_t* gu, const uint16_t* da, int64_t rows, int64_t I, uint16_t* h,
                           uint16_t* dgu, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < rows; ++i) {
        const uint16_t* __restrict__ g = gu + i * 2 * I;
        const uint16_t* __restrict__ u = g + I;
        const uint16_t* __restrict__ a = da + i * I;
        uint16_t* __restrict__ o = h + i * I;
        uint16_t* __restrict__ dg = dgu + i * 2 * I;
        uint16_t* __restrict__ du = dg + I;
#pragma omp simd
        for (int64_t j = 0; j < I; ++j) {
            const float gf = bf16_to_f32(g[j]), uf = bf16_to_f32(u[j]), af = bf16_to_f32(a[j]);
            const float e = exp_f(-gf), s = 1.0f / (1.0f + e);
            const float sg = bf16_to_f32(f32_to_bf16(gf / (1.0f + e)));   // silu as the forward rounds it
            o[j] = f32_to_bf16(sg * uf);
            du[j] = f32_to_bf16(af * sg);
            const float t = bf16_to_f32(f32_to_bf16(af * uf));
            dg[j] = f32_to_bf16(t * s * (1.0f + gf * (1.0f - s)));
        }
    }
}

// Rotate-half RoPE (slick.train.fused_layers.rope / rope_backward), h = D / 2, per row n and head:
//   forward:  out[d] = bf16(x[d] * cos[d] + (d < h ? -x[d + h] : x[d - h]) * sin[d])   from bf16 x (rows of
//             row_stride elements, heads of D) into contiguous bf16 out [N, heads, D]
//   backward: out[d] = g[d] * cos[d] + (d < h ? g[d + h] * sin[d + h] : -(g[d - h] * sin[d - h]))   fp32 g, out
// cos and sin are fp32 [N, D].
extern "C" void rope_fwd(const uint16_t* x, int64_t row_stride, int64_t N, int64_t heads, int64_t D, const float* cos,
                         const float* sin, uint16_t* out, int nt) {
    const int64_t h = D / 2;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t n = 0; n < N; ++n) {
        const float* __restrict__ c = cos + n * D;
        const float* __restrict__ s = sin + n * D;
        for (int64_t k = 0; k < heads; ++k) {
            const uint16_t* __restrict__ xr = x + n * row_stride + k * D;
            uint16_t* __restrict__ o = out + (n * heads + k) * D;
#pragma omp simd
            for (int64_t d = 0; d < h; ++d)
                o[d] = f32_to_bf16(bf16_to_f32(xr[d]) * c[d] + (-bf16_to_f32(xr[d + h])) * s[d]);
#pragma omp simd
            for (int64_t d = h; d < D; ++d)
                o[d] = f32_to_bf16(bf16_to_f32(xr[d]) * c[d] + bf16_to_f32(xr[d - h]) * s[d]);
        }
    }
}

extern "C" void rope_bwd(const float* g, int64_t N, int64_t heads, int64_t D, const float* cos, const float* sin,
                         float* out, int nt) {
    const int64_t h = D / 2;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t n = 0; n < N; ++n) {
        const float* __restrict__ c = cos + n * D;
        const float* __restrict__ s = sin + n * D;
        for (int64_t k = 0; k < heads; ++k) {
            const float* __restrict__ gr = g + (n * heads + k) * D;
            float* __restrict__ o = out + (n * heads + k) * D;
#pragma omp simd
            for (int64_t d = 0; d < h; ++d) o[d] = gr[d] * c[d] + gr[d + h] * s[d + h];
#pragma omp simd
            for (int64_t d = h; d < D; ++d) o[d] = gr[d] * c[d] + -(gr[d - h] * s[d - h]);
        }
    }
}
