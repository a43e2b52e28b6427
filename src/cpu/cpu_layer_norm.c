/* Layer norm on the CPU: each row of D elements (the normalised trailing dims) is loaded
   once into an accumulation-type buffer (F32, F64 for F64), normalised and stored; the
   backward reads x and gy once per row and recomputes xhat from the saved mean and rstd.
   Rows run in parallel; weight and bias gradients are summed per thread range, then across
   ranges in a fixed order. */
#include <math.h>
#include <string.h>
#include "cpu.h"

typedef struct {
    int64_t D;
    const char *x, *gy;
    char *y, *gx;
    int64_t xes, yes, gyes, gxes; /* element sizes */
    mt_dtype xdt, ydt, gydt, gxdt;
    const void *w, *b;
    void *mean, *rstd;
    void *part; /* [parts][2][D] weight and bias gradient partials, or NULL */
    double eps;
} ln_ctx;

#define MT_ACCUM_IMPL "cpu_layer_norm_impl.h"
#include "cpu_accum_types.h"

static const char *opt_data(const mt_tensor *t) {
    return t ? mt_tensor_data(t) : NULL;
}
static int64_t esize(const mt_tensor *t) {
    return t ? (int64_t)mt_dtype_size(t->dtype) : 0;
}

static int oom(const char *what) {
    return mt_error_set(MT_ERR_OOM, "%s: out of memory for row buffers", what);
}

int mt_cpu_layer_norm(mt_tensor *y, mt_tensor *mean, mt_tensor *rstd, const mt_tensor *x,
                      const mt_tensor *weight, const mt_tensor *bias, double eps) {
    int64_t rows = mean->numel;
    if (rows == 0 || x->numel == 0) return 0;
    ln_ctx c = {.D = x->numel / rows,
                .x = mt_tensor_data(x),
                .y = mt_tensor_data(y),
                .xes = esize(x),
                .yes = esize(y),
                .xdt = x->dtype,
                .ydt = y->dtype,
                .w = opt_data(weight),
                .b = opt_data(bias),
                .mean = mt_tensor_data(mean),
                .rstd = mt_tensor_data(rstd),
                .eps = eps};
    bool wide = mean->dtype == MT_F64;
    int rc = mt_cpu_for_parts(wide ? ln_rows_d : ln_rows_f, &c, rows, x->numel * 4);
    return rc ? oom("mt_layer_norm") : 0;
}

int mt_cpu_layer_norm_backward(mt_tensor *gx, mt_tensor *gw, mt_tensor *gb, const mt_tensor *gy,
                               const mt_tensor *x, const mt_tensor *mean, const mt_tensor *rstd,
                               const mt_tensor *weight) {
    int64_t rows = mean->numel, D = rows ? x->numel / rows : 0;
    bool wide = mean->dtype == MT_F64;
    size_t ts = wide ? 8 : 4;
    int parts = mt_cpu_num_threads();
    size_t part_bytes = (gw || gb) ? (size_t)parts * 2 * (size_t)D * ts : 0;
    ln_ctx c = {.D = D,
                .x = mt_tensor_data(x),
                .gy = mt_tensor_data(gy),
                .gx = gx ? mt_tensor_data(gx) : NULL,
                .xes = esize(x),
                .gyes = esize(gy),
                .gxes = esize(gx),
                .xdt = x->dtype,
                .gydt = gy->dtype,
                .gxdt = gx ? gx->dtype : x->dtype,
                .w = opt_data(weight),
                .mean = mt_tensor_data(mean),
                .rstd = mt_tensor_data(rstd)};
    if (part_bytes) {
        c.part = mt_host_alloc(part_bytes);
        if (!c.part) return oom("mt_layer_norm backward");
        /* parts that get no rows must still read as zeros */
        for (size_t i = 0; i < part_bytes; i++) ((char *)c.part)[i] = 0;
    }
    int rc = rows ? mt_cpu_for_parts(wide ? ln_backward_rows_d : ln_backward_rows_f, &c, rows,
                                     x->numel * 6)
                  : 0;
    if (!rc && part_bytes) {
        if (wide)
            ln_reduce_parts_d(&c, parts, gw, gb);
        else
            ln_reduce_parts_f(&c, parts, gw, gb);
    }
    if (c.part) mt_host_free(c.part, part_bytes);
    return rc ? oom("mt_layer_norm backward") : 0;
}
