/* Optimizer and loss-scale formulas, written once: the CPU kernels (src/cpu/cpu_optim.c,
   src/cpu/cpu_amp.c) and the CUDA kernels expand these. The per-step constants are folded
   once in double (mt_optim_hyper), narrowed to the compute type (mt_optim_narrow_f/_d), and
   the per-element updates are stamped for float (_f: F32 parameters, and F16/BF16 ones
   through FP32 masters or registers) and double (_d: F64 parameters). The formulas follow
   torch: SGD, SGD momentum (dampening 0, optional nesterov), Adam and AdamW with bias
   correction. Each update returns the new parameter and updates its state in place. */
#ifndef MT_MATH_OPTIM_MATH_H
#define MT_MATH_OPTIM_MATH_H
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include "hd.h"

typedef enum { MT_OPTIM_SGD, MT_OPTIM_MOMENTUM, MT_OPTIM_ADAM, MT_OPTIM_ADAMW } mt_optim_kind;

/* The constants of one step, in double. */
typedef struct {
    double lr, momentum, beta1, beta2, eps;
    double l2;        /* weight decay added to the gradient (SGD, Momentum, Adam); 0 for AdamW */
    double decay;     /* AdamW's decoupled factor 1 - lr * wd; 1 otherwise */
    double inv_scale; /* the loss scale's inverse folded into the gradient, or 1 */
    double step_size; /* Adam: lr / (1 - beta1^t) */
    double bc2_sqrt;  /* Adam: sqrt(1 - beta2^t) */
} mt_optim_hyper;

/* Weight decay either joins the gradient as an L2 term or (AdamW, decoupled) shrinks the
   parameter before the update. */
MT_HD void mt_optim_weight_decay(double lr, double weight_decay, bool decoupled, double *l2,
                                 double *decay) {
    *l2 = decoupled ? 0.0 : weight_decay;
    *decay = decoupled ? 1.0 - lr * weight_decay : 1.0;
}

/* Adam's bias correction at step t (counted from 1). */
MT_HD void mt_adam_bias_correction(double lr, double beta1, double beta2, double t,
                                   double *step_size, double *bc2_sqrt) {
    *step_size = lr / (1.0 - pow(beta1, t));
    *bc2_sqrt = sqrt(1.0 - pow(beta2, t));
}

/* The per-element formulas for element type T (suffix S). The constants are narrowed from
   the double fold once per step (1 - beta is taken in double, then narrowed). */
#define MT_OPTIM_FORMULAS(T, S, SQRT)                                                              \
    typedef struct {                                                                               \
        T lr, l2, inv_scale, momentum, beta1, one_minus_beta1, beta2, one_minus_beta2, eps,        \
            step_size, bc2_sqrt, decay;                                                            \
    } mt_optim_consts_##S;                                                                         \
    MT_HD mt_optim_consts_##S mt_optim_narrow_##S(const mt_optim_hyper *h) {                       \
        mt_optim_consts_##S c;                                                                     \
        c.lr = (T)h->lr;                                                                           \
        c.l2 = (T)h->l2;                                                                           \
        c.inv_scale = (T)h->inv_scale;                                                             \
        c.momentum = (T)h->momentum;                                                               \
        c.beta1 = (T)h->beta1;                                                                     \
        c.one_minus_beta1 = (T)(1.0 - h->beta1);                                                   \
        c.beta2 = (T)h->beta2;                                                                     \
        c.one_minus_beta2 = (T)(1.0 - h->beta2);                                                   \
        c.eps = (T)h->eps;                                                                         \
        c.step_size = (T)h->step_size;                                                             \
        c.bc2_sqrt = (T)h->bc2_sqrt;                                                               \
        c.decay = (T)h->decay;                                                                     \
        return c;                                                                                  \
    }                                                                                              \
    /* the gradient an update sees: unscaled, plus the L2 term */                                  \
    MT_HD T mt_optim_grad_##S(T g, T p, mt_optim_consts_##S c) {                                   \
        return g * c.inv_scale + c.l2 * p;                                                         \
    }                                                                                              \
    /* SGD: p - lr * g */                                                                          \
    MT_HD T mt_sgd_update_##S(T p, T g, mt_optim_consts_##S c) {                                   \
        return p - c.lr * mt_optim_grad_##S(g, p, c);                                              \
    }                                                                                              \
    /* SGD momentum, dampening 0: buf = mu buf + g; p - lr buf, or p - lr (g + mu buf) with        \
       nesterov. Pass nesterov as a constant so each loop keeps one form. */                       \
    MT_HD T mt_momentum_update_##S(T p, T g, T *buf, mt_optim_consts_##S c, bool nesterov) {       \
        T gi = mt_optim_grad_##S(g, p, c);                                                         \
        T b = c.momentum * *buf + gi;                                                              \
        *buf = b;                                                                                  \
        return p - c.lr * (nesterov ? gi + c.momentum * b : b);                                    \
    }                                                                                              \
    /* Adam/AdamW: m and v are the first and second moments; the bias correction is folded         \
       into step_size and bc2_sqrt, AdamW's decoupled decay into decay */                          \
    MT_HD T mt_adam_update_##S(T p, T g, T *m, T *v, mt_optim_consts_##S c) {                      \
        T gi = mt_optim_grad_##S(g, p, c);                                                         \
        T m1 = c.beta1 * *m + c.one_minus_beta1 * gi;                                              \
        T m2 = c.beta2 * *v + c.one_minus_beta2 * gi * gi;                                         \
        *m = m1;                                                                                   \
        *v = m2;                                                                                   \
        return p * c.decay - c.step_size * (m1 / (SQRT(m2) / c.bc2_sqrt + c.eps));                 \
    }

MT_OPTIM_FORMULAS(float, f, sqrtf)
MT_OPTIM_FORMULAS(double, d, sqrt)

/* The dynamic loss scale after one step (torch's GradScaler.update, plus backoff_after and
   bounds): an inf/nan step counts as bad and skipped and, after backoff_after bad steps in a
   row, multiplies the scale by backoff_factor (not below min_scale); growth_interval good
   steps in a row multiply it by growth_factor, to at most max_scale; a growth whose result
   is not finite in FP32 (the scale's storage) keeps the old scale, as torch and Paddle do.
   The counters are whole numbers held in doubles. */
MT_HD void mt_loss_scale_update(bool found_inf, double *scale, double *good_steps,
                                double *bad_steps, double *skipped_steps, double growth_factor,
                                double backoff_factor, int growth_interval, int backoff_after,
                                double min_scale, double max_scale) {
    if (found_inf) {
        *bad_steps += 1;
        *good_steps = 0;
        *skipped_steps += 1;
        if (*bad_steps >= backoff_after) {
            *scale = fmax(*scale * backoff_factor, min_scale);
            *bad_steps = 0;
        }
    } else {
        *good_steps += 1;
        *bad_steps = 0;
        if (*good_steps >= growth_interval) {
            double grown = *scale * growth_factor;
            if (grown <= FLT_MAX) *scale = grown <= max_scale ? grown : max_scale;
            *good_steps = 0;
        }
    }
}
#endif
