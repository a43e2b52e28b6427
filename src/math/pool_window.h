/* The window of one 2-d pooling output, torch's rules, written once for the CPU loops and the
   CUDA kernels. Window pooling: the window of output (oh, ow) starts at o * stride - padding;
   the divisor of an average counts the window clipped to the padded input (count_include_pad)
   or to the input. Adaptive: [floor(o H / OH), ceil((o + 1) H / OH)). */
#ifndef MT_MATH_POOL_WINDOW_H
#define MT_MATH_POOL_WINDOW_H
#include <stdbool.h>
#include <stdint.h>
#include "hd.h"

typedef struct {
    int64_t h0, h1, w0, w1; /* the window, clipped to the input */
    double divisor;         /* averages */
} mt_pool_window;

MT_HD int64_t mt_pool_floor_div(int64_t a, int64_t b) {
    return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

/* adaptive: kernel, stride and padding unused */
MT_HD void mt_pool_window_of(bool adaptive, const int64_t *kernel, const int64_t *stride,
                             const int64_t *padding, bool count_include_pad, int64_t oh, int64_t ow,
                             int64_t H, int64_t W, int64_t OH, int64_t OW, mt_pool_window *w) {
    if (adaptive) {
        w->h0 = mt_pool_floor_div(oh * H, OH);
        w->h1 = -mt_pool_floor_div(-(oh + 1) * H, OH); /* ceil */
        w->w0 = mt_pool_floor_div(ow * W, OW);
        w->w1 = -mt_pool_floor_div(-(ow + 1) * W, OW);
        w->divisor = (double)((w->h1 - w->h0) * (w->w1 - w->w0));
        return;
    }
    int64_t hs = oh * stride[0] - padding[0], ws = ow * stride[1] - padding[1];
    int64_t he = hs + kernel[0], we = ws + kernel[1];
    /* torch's divisor with padding counts the window clipped to the padded input */
    int64_t hp = he < H + padding[0] ? he : H + padding[0];
    int64_t wp = we < W + padding[1] ? we : W + padding[1];
    double padded = (double)(hp - hs) * (double)(wp - ws); /* a window can exceed int64 */
    w->h0 = hs > 0 ? hs : 0;
    w->w0 = ws > 0 ? ws : 0;
    w->h1 = he < H ? he : H;
    w->w1 = we < W ? we : W;
    w->divisor = count_include_pad ? padded : (double)((w->h1 - w->h0) * (w->w1 - w->w0));
}
#endif
