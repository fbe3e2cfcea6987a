// AdamW with bf16 moments and stochastic rounding in one pass over memory (slick/train/native_adamw.py).
//
// The update is torch's fused AdamW (aten FusedAdamKernel, ADAMW mode) in fp32: decay the weight, lerp the first
// moment, blend the second, then step by lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps). The moments are read from
// bf16, updated in fp32 and stored back in bf16 rounded stochastically: the low 16 bits of the fp32 value plus a
// dither value from the caller's table carry into the kept bits (slick.train.optim.stochastic_round_bf16).
// Slice s of _SLICE elements reads its first moment's dither at dither + m_off[s] and its second's at
// dither + v_off[s], exactly as the torch path does.
#include <cmath>
#include <cstdint>
#include <cstring>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t round_bf16(float x, int32_t dither) {
    int32_t i;
    std::memcpy(&i, &x, 4);
    uint32_t u = (uint32_t)i + (uint32_t)dither;   // two's complement add, as torch's int32 add
    return (uint16_t)(u >> 16);
}

// One chunk of the update. SMALL_W: the lerp weight (1 - beta1) is < 0.5, aten's lerp branch, decided once per
// call, so that the loop has no branch and vectorizes (built with -fno-math-errno: sqrt has no errno branch).
template <bool SMALL_W>
static inline void update_chunk(float* __restrict__ wp, const float* __restrict__ gp, uint16_t* __restrict__ mp,
                                uint16_t* __restrict__ vp, const int32_t* __restrict__ dm,
                                const int32_t* __restrict__ dv, int64_t len, float decay, float beta1,
                                float one_minus_beta1, float beta2, float one_minus_beta2, float step_size,
                                float bias_correction2_sqrt, float eps) {
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
        const float p = wp[i] * decay;
        const float gr = gp[i];
        float ma = bf16_to_f32(mp[i]);
        float va = bf16_to_f32(vp[i]);
        // lerp as aten computes it: weight < 0.5 ? a + w (b - a) : b - (b - a)(1 - w)
        ma = SMALL_W ? ma + one_minus_beta1 * (gr - ma) : gr - (gr - ma) * beta1;
        va = va * beta2 + one_minus_beta2 * gr * gr;
        const float denom = std::sqrt(va) / bias_correction2_sqrt + eps;
        wp[i] = p - step_size * ma / denom;
        mp[i] = round_bf16(ma, dm[i]);
        vp[i] = round_bf16(va, dv[i]);
    }
}

extern "C" void adamw_bf16_moments(float* w, const float* g, uint16_t* m, uint16_t* v, int64_t n, int64_t slice,
                                   const int32_t* dither, const int64_t* m_off, const int64_t* v_off, float lr,
                                   float beta1, float beta2, float eps, float weight_decay, float bias_correction1,
                                   float bias_correction2_sqrt, int nthreads) {
    const float step_size = lr / bias_correction1;
    const float decay = 1.0f - lr * weight_decay;
    const float one_minus_beta1 = 1.0f - beta1;
    const float one_minus_beta2 = 1.0f - beta2;
    const bool small_w = one_minus_beta1 < 0.5f;
    const int64_t chunk = 8192;                         // a divisor of the slice: a chunk lies in one slice
    const int64_t nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t c = 0; c < nchunks; ++c) {
        const int64_t lo = c * chunk, len = lo + chunk < n ? chunk : n - lo;
        const int64_t s = lo / slice, j0 = lo - s * slice;
        const int32_t* dm = dither + m_off[s] + j0;
        const int32_t* dv = dither + v_off[s] + j0;
        if (small_w)
            update_chunk<true>(w + lo, g + lo, m + lo, v + lo, dm, dv, len, decay, beta1, one_minus_beta1, beta2,
                               one_minus_beta2, step_size, bias_correction2_sqrt, eps);
        else
            update_chunk<false>(w + lo, g + lo, m + lo, v + lo, dm, dv, len, decay, beta1, one_minus_beta1, beta2,
                                one_minus_beta2, step_size, bias_correction2_sqrt, eps);
    }
}
