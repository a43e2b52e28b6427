/* The fused multi-tensor optimizer step: one pass over every parameter (and its gradient,
   master and moments), split into fixed-size chunks that one OpenMP loop shares out, so many
   small parameters and a few large ones both keep every thread busy. The update runs in FP32
   registers (F64 for F64 parameters) on blocks of BLOCK elements, in memory order when the
   parameter and its state share one dense layout (row-major or channels-last); FP32/F64 data
   laid out in that order is updated where it lies, anything else goes through a stack
   buffer. */
#include <math.h>
#include <stdlib.h>
#include "../math/optim_math.h"
#include "cpu.h"

#define BLOCK 256
#define CHUNK (64 * BLOCK) /* elements per parallel work item */

/* The per-call constants of the update, folded once on the host. */
typedef struct {
    mt_optim_kind kind;
    bool nesterov;
    mt_optim_hyper h;
} optim_consts;

/* The update rules (src/math/optim_math.h) over arrays, stamped for float and double; the
   kind switch sits outside the loops, and nesterov is passed as a constant, so each loop
   vectorises. */
#define DEFINE_UPDATE(T, S)                                                                        \
    static void update_##S(const optim_consts *oc, T *restrict p, const T *restrict g,             \
                           T *restrict m1, T *restrict m2, int64_t n) {                            \
        const mt_optim_consts_##S c = mt_optim_narrow_##S(&oc->h);                                 \
        switch (oc->kind) {                                                                        \
        case MT_OPTIM_SGD:                                                                         \
            for (int64_t i = 0; i < n; i++) p[i] = mt_sgd_update_##S(p[i], g[i], c);               \
            break;                                                                                 \
        case MT_OPTIM_MOMENTUM:                                                                    \
            if (oc->nesterov)                                                                      \
                for (int64_t i = 0; i < n; i++)                                                    \
                    p[i] = mt_momentum_update_##S(p[i], g[i], &m1[i], c, true);                    \
            else                                                                                   \
                for (int64_t i = 0; i < n; i++)                                                    \
                    p[i] = mt_momentum_update_##S(p[i], g[i], &m1[i], c, false);                   \
            break;                                                                                 \
        case MT_OPTIM_ADAM:                                                                        \
        case MT_OPTIM_ADAMW:                                                                       \
            for (int64_t i = 0; i < n; i++) {                                                      \
                /* the moments go through locals: pointers into two restrict arrays passed         \
                   on would lose restrict and make the compiler version the loop */                \
                T m = m1[i], v = m2[i];                                                            \
                p[i] = mt_adam_update_##S(p[i], g[i], &m, &v, c);                                  \
                m1[i] = m;                                                                         \
                m2[i] = v;                                                                         \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
    }

DEFINE_UPDATE(float, f)
DEFINE_UPDATE(double, d)

/* Loads (store false) or stores elements [begin, begin + n) of t from/to buf (float, or double
   when wide), converting dtype: in memory order when flat (t is dense), else in row-major
   order, strided layouts walked one innermost run at a time. */
static void transfer(const mt_tensor *t, int64_t begin, int64_t n, void *buf, bool wide, bool store,
                     bool flat) {
    char *base = mt_tensor_data(t);
    int64_t es = (int64_t)mt_dtype_size(t->dtype);
    int64_t idx[MT_MAX_DIMS] = {0};
    int nd = t->ndim, last = nd - 1;
    bool contiguous = flat || mt_is_contiguous(t);
    if (contiguous && !wide && (t->dtype == MT_F16 || t->dtype == MT_BF16)) {
        /* the unit-stride converters vectorise (F16C for F16) */
        uint16_t *h = (uint16_t *)base + begin;
        float *f = buf;
        if (t->dtype == MT_F16) {
            if (store)
                mt_cpu_f32_to_f16(f, h, n);
            else
                mt_cpu_f16_to_f32(h, f, n);
        } else {
            if (store)
                mt_cpu_f32_to_bf16(f, h, n);
            else
                mt_cpu_bf16_to_f32(h, f, n);
        }
        return;
    }
    if (!contiguous) {
        int64_t rem = begin;
        for (int d = last; d >= 0; d--) {
            idx[d] = rem % t->shape[d];
            rem /= t->shape[d];
        }
    }
    int64_t done = 0;
    while (done < n) {
        char *ptr;
        int64_t run, stride;
        if (contiguous) {
            ptr = base + begin * es;
            run = n;
            stride = es;
        } else {
            int64_t off = 0;
            for (int d = 0; d < nd; d++) off += idx[d] * t->strides[d];
            ptr = base + off * es;
            run = t->shape[last] - idx[last];
            if (run > n - done) run = n - done;
            stride = t->strides[last] * es;
        }
        if (wide) {
            double *b = (double *)buf + done;
            if (store)
                mt_cpu_store_f64(ptr, stride, t->dtype, run, b);
            else
                mt_cpu_load_f64(ptr, stride, t->dtype, run, b);
        } else {
            float *b = (float *)buf + done;
            if (store)
                mt_cpu_store_f32(ptr, stride, t->dtype, run, b);
            else
                mt_cpu_load_f32(ptr, stride, t->dtype, run, b);
        }
        done += run;
        if (!contiguous) {
            idx[last] += run;
            for (int d = last; d > 0 && idx[d] == t->shape[d]; d--) {
                idx[d] = 0;
                idx[d - 1]++;
            }
        }
    }
}

/* Element i of an operand, in the chunk's order (memory order when flat, else row-major),
   lies at data + i: the operand is updated where it lies, not through a block buffer. */
static bool in_place(const mt_tensor *t, mt_dtype dt, bool flat) {
    return t->dtype == dt && (flat || mt_is_contiguous(t));
}

/* Updates elements [b, e) of one parameter, in memory order when flat (every operand is
   dense with the parameter's strides: a channels-last parameter and its state), else in
   row-major order. The working copy of the parameter is its FP32 master when it has one
   (then rounded into the parameter), else the parameter itself; each operand is used where
   it lies (in_place) or through a block buffer loaded and stored back. */
#define DEFINE_CHUNK(T, S, DT, WIDE)                                                               \
    static void chunk_##S(const optim_consts *c, mt_tensor *p, const mt_tensor *g,                 \
                          mt_tensor *master, mt_tensor *m1, mt_tensor *m2, bool flat, int64_t b,   \
                          int64_t e) {                                                             \
        T pbuf[BLOCK], gbuf[BLOCK], m1buf[BLOCK], m2buf[BLOCK];                                    \
        mt_tensor *w = master ? master : p; /* the working copy */                                 \
        T *wd = in_place(w, DT, flat) ? (T *)mt_tensor_data(w) : NULL;                             \
        const T *gd = in_place(g, DT, flat) ? (const T *)mt_tensor_data(g) : NULL;                 \
        T *m1d = m1 && in_place(m1, DT, flat) ? (T *)mt_tensor_data(m1) : NULL;                    \
        T *m2d = m2 && in_place(m2, DT, flat) ? (T *)mt_tensor_data(m2) : NULL;                    \
        for (int64_t i = b; i < e; i += BLOCK) {                                                   \
            int64_t m = e - i < BLOCK ? e - i : BLOCK;                                             \
            T *pp = wd ? wd + i : pbuf, *mm1 = m1d ? m1d + i : m1buf,                              \
              *mm2 = m2d ? m2d + i : m2buf;                                                        \
            const T *gg = gd ? gd + i : gbuf;                                                      \
            if (!wd) transfer(w, i, m, pbuf, WIDE, false, flat);                                   \
            if (!gd) transfer(g, i, m, gbuf, WIDE, false, flat);                                   \
            if (m1 && !m1d) transfer(m1, i, m, m1buf, WIDE, false, flat);                          \
            if (m2 && !m2d) transfer(m2, i, m, m2buf, WIDE, false, flat);                          \
            update_##S(c, pp, gg, m1 ? mm1 : NULL, m2 ? mm2 : NULL, m);                            \
            if (!wd) transfer(w, i, m, pp, WIDE, true, flat);                                      \
            if (master) transfer(p, i, m, pp, WIDE, true, flat);                                   \
            if (m1 && !m1d) transfer(m1, i, m, m1buf, WIDE, true, flat);                           \
            if (m2 && !m2d) transfer(m2, i, m, m2buf, WIDE, true, flat);                           \
        }                                                                                          \
    }

DEFINE_CHUNK(float, f, MT_F32, false)
DEFINE_CHUNK(double, d, MT_F64, true)

typedef struct {
    const mt_optim_step_args *a;
    const optim_consts *c; /* Adam: one per parameter (its own step count); else one for all */
    bool per_param;
    const int64_t *prefix; /* prefix[k]: the first global chunk of parameter k */
} step_ctx;

static void run_chunk(const step_ctx *s, int k, int64_t local) {
    const mt_optim_step_args *a = s->a;
    mt_tensor *p = a->params[k];
    int64_t b = local * CHUNK, e = b + CHUNK < p->numel ? b + CHUNK : p->numel;
    mt_tensor *master = a->masters ? a->masters[k] : NULL;
    mt_tensor *m1 = a->moment1 ? a->moment1[k] : NULL;
    mt_tensor *m2 = a->moment2 ? a->moment2[k] : NULL;
    const mt_tensor *g = a->grads[k];
    const optim_consts *c = s->c + (s->per_param ? k : 0);
    /* memory order when every operand shares the parameter's dense layout (a contiguous
       parameter and its state are the row-major case of it) */
    bool flat = mt_is_dense(p) && mt_same_strides(p, g) &&
                (!master || mt_same_strides(p, master)) && (!m1 || mt_same_strides(p, m1)) &&
                (!m2 || mt_same_strides(p, m2));
    if (p->dtype == MT_F64)
        chunk_d(c, p, g, NULL, m1, m2, flat, b, e);
    else
        chunk_f(c, p, g, master, m1, m2, flat, b, e);
}

/* The parameter owning global chunk ch: the last k with prefix[k] <= ch. */
static int chunk_owner(const int64_t *prefix, int n, int64_t ch) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (prefix[mid] <= ch)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

int mt_cpu_optim_step(const mt_optim_step_args *a) {
    /* the skip flag is read here, by the kernel, so the caller never syncs on it */
    if (a->found_inf && *(const float *)mt_tensor_data(a->found_inf) != 0.0f) return 0;
    bool adam = a->kind == MT_OPTIM_ADAM || a->kind == MT_OPTIM_ADAMW;
    optim_consts c = {
        .kind = a->kind,
        .nesterov = a->nesterov,
        .h = {.lr = a->lr,
              .momentum = a->momentum,
              .beta1 = a->beta1,
              .beta2 = a->beta2,
              .eps = a->eps,
              .inv_scale =
                  a->inv_scale ? (double)*(const float *)mt_tensor_data(a->inv_scale) : 1.0},
    };
    mt_optim_weight_decay(a->lr, a->weight_decay, a->kind == MT_OPTIM_ADAMW, &c.h.l2, &c.h.decay);

    /* prefix: n + 1 chunk offsets; Adam also n sets of constants, one per step count */
    enum { SMALL = 32 };
    int64_t prefix_small[SMALL + 1];
    optim_consts consts_small[SMALL];
    bool small = a->n <= SMALL;
    int64_t *prefix = small ? prefix_small : mt_heap_alloc(((size_t)a->n + 1) * sizeof *prefix);
    optim_consts *consts = !adam   ? &c
                           : small ? consts_small
                                   : mt_heap_alloc((size_t)a->n * sizeof *consts);
    if (!prefix || !consts) {
        if (!small) {
            free(prefix);
            if (consts != &c) free(consts);
        }
        return mt_error_set(MT_ERR_OOM, "mt_optimizer_step: out of memory planning %d tensors",
                            a->n);
    }
    float *steps = adam && a->step_count ? (float *)mt_tensor_data(a->step_count) : NULL;
    int64_t total = 0;
    prefix[0] = 0;
    for (int k = 0; k < a->n; k++) {
        int64_t numel = a->grads[k] ? a->params[k]->numel : 0;
        total += numel;
        prefix[k + 1] = prefix[k] + (numel + CHUNK - 1) / CHUNK;
        if (adam) { /* Adam's t counts the steps that updated this parameter, as torch's */
            consts[k] = c;
            double t = (steps ? (double)steps[k] : 0.0) + 1.0;
            mt_adam_bias_correction(a->lr, a->beta1, a->beta2, t, &consts[k].h.step_size,
                                    &consts[k].h.bc2_sqrt);
        }
    }
    int64_t nchunks = prefix[a->n];
    step_ctx s = {a, consts, adam, prefix};
    int threads = mt_cpu_num_threads();
    if (threads <= 1 || total < MT_CPU_PARALLEL_MIN || nchunks < 2) {
        for (int k = 0; k < a->n; k++)
            for (int64_t ch = prefix[k]; ch < prefix[k + 1]; ch++) run_chunk(&s, k, ch - prefix[k]);
    } else {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t ch = 0; ch < nchunks; ch++) {
            int k = chunk_owner(prefix, a->n, ch);
            run_chunk(&s, k, ch - prefix[k]);
        }
    }
    for (int k = 0; steps && k < a->n; k++)
        if (a->grads[k]) steps[k] = (float)((double)steps[k] + 1.0);
    if (!small) {
        free(prefix);
        if (consts != &c) free(consts);
    }
    return 0;
}
