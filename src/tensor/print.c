/* Printing: tensor([[1.0000, 2.0000], [3.0000, 4.0000]], dtype=f32, shape=[2, 2]).
   Dims longer than 6 show their first and last 3 entries around "...". The shown entries are
   gathered on the tensor's device with the backend copy kernel (so a huge or non-contiguous
   tensor is never copied whole), then converted to F64 (I64 for I64) on the host. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "../autograd/node.h"
#include "backend.h"

#define EDGE 3 /* entries shown at each end of a summarised dim */

/* ---- a string builder with snprintf semantics: len counts everything, buf gets a prefix */
typedef struct {
    char *buf;
    size_t cap, len;
} sbuf;

static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = s->len < s->cap ? s->cap - s->len : 0;
    int n = vsnprintf(room ? s->buf + s->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) s->len += (size_t)n;
}

/* ---- gathering the shown entries */

/* A contiguous copy of t on its device where every dim longer than 2 * EDGE keeps only its
   first and last EDGE entries; new reference or NULL with the error set. */
static mt_tensor *gather_shown(const mt_tensor *t) {
    const mt_backend *be = mt_backend_for("mt_format", t->device);
    if (!be) return NULL;
    mt_tensor *cur = mt_tensor_alias(t);
    for (int d = 0; cur && d < t->ndim; d++) {
        int64_t size = cur->shape[d];
        if (size <= 2 * EDGE) continue;
        int64_t shape[MT_MAX_DIMS];
        memcpy(shape, cur->shape, sizeof shape);
        shape[d] = 2 * EDGE;
        mt_tensor *next = mt_tensor_new("mt_format", cur->ndim, shape, cur->dtype, cur->device);
        int rc = next ? 0 : MT_ERR_OOM;
        for (int half = 0; half < 2 && rc == 0; half++) {
            int64_t sshape[MT_MAX_DIMS];
            memcpy(sshape, cur->shape, sizeof sshape);
            sshape[d] = EDGE;
            int64_t from = half ? size - EDGE : 0;
            mt_tensor *src = mt_tensor_view_of(cur, cur->ndim, sshape, cur->strides,
                                               cur->offset + from * cur->strides[d]);
            mt_tensor *dst = next ? mt_tensor_view_of(next, next->ndim, sshape, next->strides,
                                                      half * EDGE * next->strides[d])
                                  : NULL;
            rc = src && dst ? be->copy(dst, src) : MT_ERR_OOM;
            mt_tensor_unref(src);
            mt_tensor_unref(dst);
        }
        mt_tensor_unref(cur);
        cur = rc == 0 ? next : NULL;
        if (rc) mt_tensor_unref(next);
    }
    return cur;
}

/* The shown entries of t as host values: F64 (or I64) in a contiguous host tensor. */
static mt_tensor *shown_on_host(const mt_tensor *t) {
    mt_tensor *g = gather_shown(t);
    if (!g) return NULL;
    mt_dtype want = t->dtype == MT_I64 ? MT_I64 : MT_F64;
    mt_tensor *host = g;
    if (g->device.type != MT_DEVICE_CPU) {
        host = mt_tensor_new("mt_format", g->ndim, g->shape, g->dtype, MT_CPU);
        int rc = host ? mt_backend_get(g->device)->download(g, mt_tensor_data(host)) : MT_ERR_OOM;
        mt_tensor_unref(g);
        if (rc) {
            mt_tensor_unref(host);
            return NULL;
        }
    }
    if (host->dtype == want && mt_is_contiguous(host)) return host;
    mt_tensor *out = mt_tensor_new("mt_format", host->ndim, host->shape, want, MT_CPU);
    int rc = out ? mt_cpu_backend.copy(out, host) : MT_ERR_OOM;
    mt_tensor_unref(host);
    if (rc) {
        mt_tensor_unref(out);
        return NULL;
    }
    return out;
}

/* ---- formatting */

typedef struct {
    const mt_tensor *t; /* the original, for its sizes */
    const void *vals;   /* shown entries, contiguous, shape[d] = min(size, 2 * EDGE) */
    mt_dtype dt;
    bool sci; /* scientific notation for every float */
} fmt_ctx;

static void put_value(sbuf *s, const fmt_ctx *c, int64_t i) {
    if (c->dt == MT_I64) {
        sb_printf(s, "%lld", (long long)((const int64_t *)c->vals)[i]);
        return;
    }
    double v = ((const double *)c->vals)[i];
    if (c->dt == MT_BOOL) {
        sb_printf(s, "%s", v != 0 ? "true" : "false");
    } else if (c->dt == MT_I32) {
        sb_printf(s, "%lld", (long long)v);
    } else if (isnan(v)) {
        sb_printf(s, "nan");
    } else if (isinf(v)) {
        sb_printf(s, v > 0 ? "inf" : "-inf");
    } else {
        sb_printf(s, c->sci ? "%.4e" : "%.4f", v);
    }
}

/* Prints dim d of the block starting at shown-entry index base (stride in shown entries). */
static void put_dim(sbuf *s, const fmt_ctx *c, int d, int64_t base) {
    const mt_tensor *t = c->t;
    int64_t size = t->shape[d];
    bool summ = size > 2 * EDGE;
    int64_t shown = summ ? 2 * EDGE : size, inner = 1;
    for (int k = d + 1; k < t->ndim; k++) inner *= t->shape[k] > 2 * EDGE ? 2 * EDGE : t->shape[k];
    sb_printf(s, "[");
    for (int64_t i = 0; i < shown; i++) {
        if (i) sb_printf(s, ", ");
        if (summ && i == EDGE) sb_printf(s, "..., ");
        if (d == t->ndim - 1)
            put_value(s, c, base + i);
        else
            put_dim(s, c, d + 1, base + i * inner);
    }
    sb_printf(s, "]");
}

static void put_suffix(sbuf *s, const mt_tensor *t) {
    char b[MT_SHAPE_BUF];
    if (t->device.type == MT_DEVICE_CUDA) sb_printf(s, ", device=cuda:%d", t->device.index);
    sb_printf(s, ", dtype=%s, shape=%s", mt_dtype_name(t->dtype), mt_shape_str(t, b, sizeof b));
    if (t->grad_fn)
        sb_printf(s, ", grad_fn=%s", mt_op_name(t->grad_fn->op));
    else if (t->requires_grad)
        sb_printf(s, ", requires_grad=true");
    sb_printf(s, ")");
}

int mt_format(const mt_tensor *t, char *buf, size_t cap) {
    if (buf && cap) buf[0] = '\0';
    if (!t) return mt_error_set(MT_ERR_NULL, "mt_format: arg 1: tensor is NULL");
    if (!buf && cap)
        return mt_error_set(MT_ERR_NULL, "mt_format: arg 2: buf is NULL but cap is %zu", cap);
    sbuf s = {buf, cap, 0};
    sb_printf(&s, "tensor(");
    if (t->numel == 0) {
        sb_printf(&s, "[]");
    } else {
        mt_tensor *h = shown_on_host(t);
        if (!h) return mt_last_status() != MT_OK ? (int)mt_last_status() : MT_ERR_INTERNAL;
        fmt_ctx c = {t, mt_tensor_data(h), t->dtype, false};
        if (mt_dtype_is_floating(t->dtype)) { /* torch's rule for scientific notation */
            double lo = INFINITY, hi = 0;
            const double *v = c.vals;
            for (int64_t i = 0; i < h->numel; i++) {
                double a = fabs(v[i]);
                if (!isfinite(a) || a == 0) continue;
                lo = a < lo ? a : lo;
                hi = a > hi ? a : hi;
            }
            c.sci = hi >= 1e8 || (hi > 0 && lo < 1e-4);
        }
        if (t->ndim == 0)
            put_value(&s, &c, 0);
        else
            put_dim(&s, &c, 0, 0);
        mt_tensor_unref(h);
    }
    put_suffix(&s, t);
    if (s.len > (size_t)INT32_MAX) return mt_error_set(MT_ERR_INVALID, "mt_format: text too long");
    return (int)s.len;
}

int mt_print(const mt_tensor *t, FILE *f) {
    if (!t) return mt_error_set(MT_ERR_NULL, "mt_print: arg 1: tensor is NULL");
    if (!f) return mt_error_set(MT_ERR_NULL, "mt_print: arg 2: FILE is NULL");
    int n = mt_format(t, NULL, 0);
    if (n < 0) return n;
    char *buf = malloc((size_t)n + 1);
    if (!buf) return mt_error_set(MT_ERR_OOM, "mt_print: out of memory for %d characters", n);
    mt_format(t, buf, (size_t)n + 1);
    int rc = fputs(buf, f) < 0 || fputc('\n', f) == EOF ? MT_ERR_INTERNAL : 0;
    free(buf);
    if (rc) return mt_error_set(MT_ERR_INTERNAL, "mt_print: writing to the stream failed");
    return 0;
}
