// RMSNorm forward and backward of the trainer's fused decoder layers, one pass over memory each
// (slick/train/native_norm.py). The maths is slick.train.fused_layers.rms_norm / rms_norm_backward for an fp32
// residual stream and bf16 matmuls, in fp32:
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
