/* Plain F64 convolution loops on any strides: the CPU backend's path for F64 tensors, which
   oneDNN does not have. They exist so that mt_gradcheck can check conv2d's gradients in FP64;
   they are direct sums, written for clarity, not speed. */
#include "cpu.h"

/* Element (n, c, h, w) of a 4-d F64 tensor. */
static inline double *at(const mt_tensor *t, int64_t n, int64_t c, int64_t h, int64_t w) {
    const int64_t *s = t->strides;
    return (double *)mt_tensor_data(t) + n * s[0] + c * s[1] + h * s[2] + w * s[3];
}

/* The input row (d 0) or column (d 1) read by output position o at kernel tap k, or -1 when
   it is padding. */
static inline int64_t in_pos(const mt_conv2d_params *p, int d, int64_t o, int64_t k, int64_t size) {
    int64_t i = o * p->stride[d] - p->padding[d] + k * p->dilation[d];
    return i >= 0 && i < size ? i : -1;
}

/* The statements after the arguments for every tap (ic, kh, kw) of output (oh, ow) that reads
   the input at (ih, iw), not the padding, in the order the sums are taken. */
#define FOR_TAPS(p, ICg, KH, KW, H, W, oh, ow, ...)                                                \
    for (int64_t ic = 0; ic < (ICg); ic++)                                                         \
        for (int64_t kh = 0; kh < (KH); kh++) {                                                    \
            int64_t ih = in_pos((p), 0, oh, kh, (H));                                              \
            if (ih < 0) continue;                                                                  \
            for (int64_t kw = 0; kw < (KW); kw++) {                                                \
                int64_t iw = in_pos((p), 1, ow, kw, (W));                                          \
                if (iw >= 0) {                                                                     \
                    __VA_ARGS__                                                                    \
                }                                                                                  \
            }                                                                                      \
        }

int mt_cpu_conv2d_ref(mt_tensor *y, const mt_tensor *x, const mt_tensor *w, const mt_tensor *b,
                      const mt_conv2d_params *p) {
    int64_t N = y->shape[0], OC = y->shape[1], OH = y->shape[2], OW = y->shape[3];
    int64_t H = x->shape[2], W = x->shape[3], ICg = w->shape[1], KH = w->shape[2], KW = w->shape[3],
            OCg = OC / p->groups;
#pragma omp parallel for collapse(2) num_threads(mt_cpu_num_threads())
    for (int64_t n = 0; n < N; n++)
        for (int64_t oc = 0; oc < OC; oc++) {
            int64_t c0 = oc / OCg * ICg;
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    double s = b ? *(const double *)((const char *)mt_tensor_data(b) +
                                                     oc * b->strides[0] * 8)
                                 : 0.0;
                    FOR_TAPS(p, ICg, KH, KW, H, W, oh, ow,
                             s += *at(x, n, c0 + ic, ih, iw) * *at(w, oc, ic, kh, kw);)
                    *at(y, n, oc, oh, ow) = s;
                }
        }
    return 0;
}

int mt_cpu_conv2d_backward_data_ref(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *w,
                                    const mt_conv2d_params *p) {
    int64_t N = gx->shape[0], C = gx->shape[1], H = gx->shape[2], W = gx->shape[3];
    int64_t OC = gy->shape[1], OH = gy->shape[2], OW = gy->shape[3], ICg = w->shape[1],
            KH = w->shape[2], KW = w->shape[3], OCg = OC / p->groups;
    /* one sample per thread: the scatter of one sample never touches another's gradient */
#pragma omp parallel for num_threads(mt_cpu_num_threads())
    for (int64_t n = 0; n < N; n++) {
        for (int64_t c = 0; c < C; c++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t x = 0; x < W; x++) *at(gx, n, c, h, x) = 0.0;
        for (int64_t oc = 0; oc < OC; oc++) {
            int64_t c0 = oc / OCg * ICg;
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    double g = *at(gy, n, oc, oh, ow);
                    FOR_TAPS(p, ICg, KH, KW, H, W, oh, ow,
                             *at(gx, n, c0 + ic, ih, iw) += g * *at(w, oc, ic, kh, kw);)
                }
        }
    }
    return 0;
}

int mt_cpu_conv2d_backward_weight_ref(mt_tensor *gw, const mt_tensor *gy, const mt_tensor *x,
                                      const mt_conv2d_params *p) {
    int64_t N = gy->shape[0], OC = gy->shape[1], OH = gy->shape[2], OW = gy->shape[3];
    int64_t H = x->shape[2], W = x->shape[3], ICg = gw->shape[1], KH = gw->shape[2],
            KW = gw->shape[3], OCg = OC / p->groups;
#pragma omp parallel for num_threads(mt_cpu_num_threads())
    for (int64_t oc = 0; oc < OC; oc++) {
        int64_t c0 = oc / OCg * ICg;
        for (int64_t ic = 0; ic < ICg; ic++)
            for (int64_t kh = 0; kh < KH; kh++)
                for (int64_t kw = 0; kw < KW; kw++) {
                    /* one sum per tap over the outputs that read it (n, oh, ow): FOR_TAPS inside
                     * out */
                    double s = 0.0;
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t oh = 0; oh < OH; oh++) {
                            int64_t ih = in_pos(p, 0, oh, kh, H);
                            if (ih < 0) continue;
                            for (int64_t ow = 0; ow < OW; ow++) {
                                int64_t iw = in_pos(p, 1, ow, kw, W);
                                if (iw >= 0)
                                    s += *at(gy, n, oc, oh, ow) * *at(x, n, c0 + ic, ih, iw);
                            }
                        }
                    *at(gw, oc, ic, kh, kw) = s;
                }
    }
    return 0;
}
