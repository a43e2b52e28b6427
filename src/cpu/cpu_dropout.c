/* Inverted dropout on the CPU: element i (flat index of the contiguous tensor) is kept when
   its Philox draw (src/math/philox.h, counter offset + i / 4, lane i % 4) is >= p, and
   scaled by 1 / (1 - p). Elements are multiplied by that factor or by 0, as torch does, so
   a dropped inf or NaN gives NaN (an overflow stays visible to the GradScaler). The mask is a pure
   function of (seed, offset, i), so the backward regenerates it instead of storing it.
   Low-precision values are converted per chunk in registers and stored back in their dtype (no
   up-cast tensor). */
#include "../math/philox.h"
#include "cpu.h"

#define CHUNK 256 /* a multiple of 4: a chunk starts on a Philox block */

typedef struct {
    const char *x;
    char *out;
    mt_dtype dt;
    int64_t es, n;
    float p;
    double scale;
    uint64_t seed, offset;
} dropout_ctx;

/* Compiled per x86-64 level (MT_CPU_CLONES): the Philox rounds vectorise a block per lane,
   with AVX2 or AVX-512 multiplies where the CPU has them. */
MT_CPU_CLONES static int dropout_chunks(void *vctx, int64_t cb, int64_t ce, int part) {
    (void)part;
    const dropout_ctx *c = vctx;
    uint32_t bits[CHUNK];
    for (int64_t k = cb; k < ce; k++) {
        int64_t b = k * CHUNK, m = c->n - b < CHUNK ? c->n - b : CHUNK;
        mt_philox4x32_fill(c->offset + (uint64_t)b / 4, c->seed, (m + 3) / 4, bits);
        const char *src = c->x + b * c->es;
        char *dst = c->out + b * c->es;
        if (c->dt == MT_F64) {
            double v[CHUNK];
            mt_cpu_load_f64(src, c->es, c->dt, m, v);
            for (int64_t j = 0; j < m; j++)
                v[j] *= mt_uint_to_unit_float(bits[j]) >= c->p ? c->scale : 0.0;
            mt_cpu_store_f64(dst, c->es, c->dt, m, v);
        } else { /* F32 read and written in place; F16 and BF16 through v */
            float v[CHUNK], s = (float)c->scale;
            bool f32 = c->dt == MT_F32;
            const float *x = f32 ? (const float *)src : v;
            float *y = f32 ? (float *)dst : v;
            if (!f32) mt_cpu_load_f32(src, c->es, c->dt, m, v);
            for (int64_t j = 0; j < m; j++)
                y[j] = x[j] * (mt_uint_to_unit_float(bits[j]) >= c->p ? s : 0.0f);
            if (!f32) mt_cpu_store_f32(dst, c->es, c->dt, m, v);
        }
    }
    return 0;
}

int mt_cpu_dropout(mt_tensor *out, const mt_tensor *x, double p, uint64_t seed, uint64_t offset) {
    dropout_ctx c = {.x = mt_tensor_data(x),
                     .out = mt_tensor_data(out),
                     .dt = x->dtype,
                     .es = (int64_t)mt_dtype_size(x->dtype),
                     .n = x->numel,
                     .p = (float)p,
                     .scale = p < 1 ? 1.0 / (1.0 - p) : 0.0,
                     .seed = seed,
                     .offset = offset};
    int64_t chunks = (c.n + CHUNK - 1) / CHUNK;
    return mt_cpu_for_parts(dropout_chunks, &c, chunks, c.n * 8);
}
