/* Printing, laid out like torch: rows on their own lines, values right-aligned to one width,
   long rows wrapped at the line width, blank lines between 2-d blocks:
       tensor([[1.0000, 2.0000],
               [3.0000, 4.0000]], dtype=f32, shape=[2, 2])
   A tensor with more than `threshold` elements is summarised: each dim longer than
   2 * edgeitems shows its first and last edgeitems entries around "...". The shown entries
   are gathered on the tensor's device with the backend copy kernel (so a huge or
   non-contiguous tensor is never copied whole), then converted to F64 (I64 for I64) on the
   host. The options are process-wide, like torch.set_printoptions. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include "../autograd/node.h"
#include "backend.h"

/* ---- options */

static const mt_print_options default_options = {
    .precision = 4, .threshold = 1000, .edgeitems = 3, .linewidth = 80, .sci_mode = -1};
static mt_print_options options;
static mtx_t options_lock;
static once_flag options_once = ONCE_FLAG_INIT;
static void options_init(void) {
    options = default_options;
    mtx_init(&options_lock, mtx_plain);
}

void mt_print_options_get(mt_print_options *out) {
    if (!out) return;
    call_once(&options_once, options_init);
    mtx_lock(&options_lock);
    *out = options;
    mtx_unlock(&options_lock);
}

int mt_print_options_set(const mt_print_options *o) {
    static const char fn[] = "mt_print_options_set";
    call_once(&options_once, options_init);
    if (!o) o = &default_options;
    if (o->precision < 0 || o->precision > 30)
        return mt_error_set(MT_ERR_INVALID, "%s: precision %d is outside [0, 30]", fn,
                            o->precision);
    if (o->threshold < 0 || o->edgeitems < 0 || o->edgeitems > 1000)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: threshold %lld and edgeitems %d must be >= 0 (edgeitems <= 1000)",
                            fn, (long long)o->threshold, o->edgeitems);
    if (o->linewidth < 1)
        return mt_error_set(MT_ERR_INVALID, "%s: linewidth %d must be >= 1", fn, o->linewidth);
    if (o->sci_mode < -1 || o->sci_mode > 1)
        return mt_error_set(MT_ERR_INVALID, "%s: sci_mode %d must be -1 (auto), 0 or 1", fn,
                            o->sci_mode);
    mtx_lock(&options_lock);
    options = *o;
    mtx_unlock(&options_lock);
    return 0;
}

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

/* A contiguous copy of t on its device where every dim longer than 2 * edge keeps only its
   first and last edge entries (edge < 0: every entry); new reference or NULL with the error
   set. */
static mt_tensor *gather_shown(const mt_tensor *t, int64_t edge) {
    const mt_backend *be = mt_backend_for("mt_format", t->device);
    if (!be) return NULL;
    mt_tensor *cur = mt_tensor_alias(t);
    for (int d = 0; cur && d < t->ndim; d++) {
        int64_t size = cur->shape[d];
        if (edge < 0 || size <= 2 * edge) continue;
        int64_t shape[MT_MAX_DIMS];
        memcpy(shape, cur->shape, sizeof shape);
        shape[d] = 2 * edge;
        mt_tensor *next = mt_tensor_new("mt_format", cur->ndim, shape, cur->dtype, cur->device);
        int rc = next ? 0 : MT_ERR_OOM;
        for (int half = 0; half < 2 && rc == 0; half++) {
            int64_t sshape[MT_MAX_DIMS];
            memcpy(sshape, cur->shape, sizeof sshape);
            sshape[d] = edge;
            int64_t from = half ? size - edge : 0;
            mt_tensor *src = mt_tensor_view_of(cur, cur->ndim, sshape, cur->strides,
                                               cur->offset + from * cur->strides[d]);
            mt_tensor *dst = next ? mt_tensor_view_of(next, next->ndim, sshape, next->strides,
                                                      half * edge * next->strides[d])
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
static mt_tensor *shown_on_host(const mt_tensor *t, int64_t edge) {
    mt_tensor *g = gather_shown(t, edge);
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
    const void *vals;   /* shown entries, contiguous */
    mt_dtype dt;
    mt_print_options o;
    int64_t edge; /* entries at each end of a summarised dim; -1: not summarised */
    bool sci;     /* scientific notation for every float */
    int width;    /* the widest shown value */
    size_t line0; /* where the current line starts in the output */
} fmt_ctx;

static bool summarised(const fmt_ctx *c, int64_t size) {
    return c->edge >= 0 && size > 2 * c->edge;
}
static int64_t shown_size(const fmt_ctx *c, int64_t size) {
    return summarised(c, size) ? 2 * c->edge : size;
}

/* One value as text (no padding). */
static int value_str(const fmt_ctx *c, int64_t i, char *buf, size_t cap) {
    if (c->dt == MT_I64)
        return snprintf(buf, cap, "%lld", (long long)((const int64_t *)c->vals)[i]);
    double v = ((const double *)c->vals)[i];
    if (c->dt == MT_BOOL) return snprintf(buf, cap, "%s", v != 0 ? "true" : "false");
    if (c->dt == MT_I32) return snprintf(buf, cap, "%lld", (long long)v);
    if (isnan(v)) return snprintf(buf, cap, "nan");
    if (isinf(v)) return snprintf(buf, cap, v > 0 ? "inf" : "-inf");
    return snprintf(buf, cap, c->sci ? "%.*e" : "%.*f", c->o.precision, v);
}

/* One value's text at most: "%.30f" of -DBL_MAX is a sign, 309 digits, a point and 30
   decimals (64 bytes cut long values short while the width counted all of them). */
#define VALUE_BUF 352

static void put_value(sbuf *s, const fmt_ctx *c, int64_t i) {
    char v[VALUE_BUF];
    value_str(c, i, v, sizeof v);
    sb_printf(s, "%*s", c->width, v);
}

static void new_line(sbuf *s, int indent) {
    sb_printf(s, "\n%*s", indent, "");
}

/* Element j of a row (idx < 0: the ellipsis, " ..." as torch writes it). Rows wrap like
   torch's: as many elements per line as (linewidth - the row's "[" column) / (width + 2)
   allows; continuation lines start at indent (one past the "["). */
static void put_elem(sbuf *s, const fmt_ctx *c, int64_t idx, int64_t j, int indent) {
    int64_t per_line = (c->o.linewidth - (indent - 1)) / (c->width + 2);
    if (per_line < 1) per_line = 1;
    if (j) {
        sb_printf(s, ",");
        if (j % per_line == 0) {
            sb_printf(s, "\n");
            sb_printf(s, "%*s", indent, "");
        } else {
            sb_printf(s, " ");
        }
    }
    if (idx < 0)
        sb_printf(s, " ...");
    else
        put_value(s, c, idx);
}

/* Dim d of the block starting at shown-entry index base; its "[" is at column col. */
static void put_dim(sbuf *s, const fmt_ctx *c, int d, int64_t base, int col) {
    const mt_tensor *t = c->t;
    int64_t size = t->shape[d], shown = shown_size(c, size), inner = 1;
    bool summ = summarised(c, size);
    for (int k = d + 1; k < t->ndim; k++) inner *= shown_size(c, t->shape[k]);
    sb_printf(s, "[");
    /* the shown entries, with "..." in position edge when the dim is summarised */
    int64_t slots = shown + (summ ? 1 : 0);
    for (int64_t j = 0; j < slots; j++) {
        bool dots = summ && j == c->edge;
        int64_t i = summ && j > c->edge ? j - 1 : j;
        if (d == t->ndim - 1) {
            put_elem(s, c, dots ? -1 : base + i, j, col + 1);
            continue;
        }
        if (j) { /* ",", then one line break per dim below this one's rows */
            sb_printf(s, ",");
            for (int k = d; k < t->ndim - 2; k++) sb_printf(s, "\n");
            new_line(s, col + 1);
        }
        if (dots)
            sb_printf(s, "...");
        else
            put_dim(s, c, d + 1, base + i * inner, col + 1);
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

/* torch's rule for scientific notation (torch/_tensor_str.py, _Formatter), over the shown
   non-zero finite magnitudes: the largest above 1e8, the smallest below 1e-4, or the
   largest over the smallest above 1000 */
static bool wants_sci(const double *v, int64_t n) {
    double lo = INFINITY, hi = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = fabs(v[i]);
        if (!isfinite(a) || a == 0) continue;
        lo = a < lo ? a : lo;
        hi = a > hi ? a : hi;
    }
    return hi > 0 && (hi > 1e8 || lo < 1e-4 || hi / lo > 1000);
}

static int format(const mt_tensor *t, char *buf, size_t cap);

int mt_format(const mt_tensor *t, char *buf, size_t cap) {
    mt_api_enter(); /* errors inside read "mt_format: ..." */
    return mt_api_exit_status(format(t, buf, cap));
}

static int format(const mt_tensor *t, char *buf, size_t cap) {
    if (buf && cap) buf[0] = '\0';
    if (!t) return mt_error_set(MT_ERR_NULL, "mt_format: arg 1: tensor is NULL");
    if (!buf && cap)
        return mt_error_set(MT_ERR_NULL, "mt_format: arg 2: buf is NULL but cap is %zu", cap);
    sbuf s = {buf, cap, 0};
    sb_printf(&s, "tensor(");
    if (t->numel == 0) {
        sb_printf(&s, "[]");
    } else {
        fmt_ctx c = {.t = t, .dt = t->dtype};
        mt_print_options_get(&c.o);
        c.edge = t->numel > c.o.threshold ? c.o.edgeitems : -1;
        mt_tensor *h = shown_on_host(t, c.edge);
        if (!h) return mt_last_status() != MT_OK ? (int)mt_last_status() : MT_ERR_INTERNAL;
        c.vals = mt_tensor_data(h);
        if (mt_dtype_is_floating(t->dtype))
            c.sci = c.o.sci_mode == 1 || (c.o.sci_mode == -1 && wants_sci(c.vals, h->numel));
        for (int64_t i = 0; i < h->numel; i++) {
            char v[VALUE_BUF];
            int n = value_str(&c, i, v, sizeof v);
            c.width = n > c.width ? n : c.width;
        }
        if (t->ndim == 0)
            put_value(&s, &c, 0);
        else
            put_dim(&s, &c, 0, 0, (int)strlen("tensor("));
        mt_tensor_unref(h);
    }
    put_suffix(&s, t);
    if (s.len > (size_t)INT32_MAX) return mt_error_set(MT_ERR_INVALID, "mt_format: text too long");
    return (int)s.len;
}

int mt_print(const mt_tensor *t, FILE *f) {
    if (!t) return mt_error_set(MT_ERR_NULL, "mt_print: arg 1: tensor is NULL");
    if (!f) return mt_error_set(MT_ERR_NULL, "mt_print: arg 2: FILE is NULL");
    mt_api_enter(); /* errors inside read "mt_print: ..." */
    int n = format(t, NULL, 0);
    if (n < 0) return mt_api_exit_status(n);
    char *buf = mt_heap_alloc((size_t)n + 1);
    if (!buf)
        return mt_api_exit_status(
            mt_error_set(MT_ERR_OOM, "mt_print: out of memory for %d characters", n));
    /* the second pass reads the tensor again and can fail too: then nothing is written */
    int rc = format(t, buf, (size_t)n + 1);
    if (rc >= 0)
        rc = fputs(buf, f) < 0 || fputc('\n', f) == EOF
                 ? mt_error_set(MT_ERR_INTERNAL, "mt_print: writing to the stream failed")
                 : 0;
    free(buf);
    return mt_api_exit_status(rc);
}
