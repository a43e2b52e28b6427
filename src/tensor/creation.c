/* Public creation functions and host transfer. */
#include <math.h>
#include <string.h>
#include "backend.h"
#include "tensor_impl.h"

/* value_arg: the position of value in op's arguments (for messages) */
static mt_tensor *filled(const char *op, int ndim, const int64_t *shape, mt_dtype dt, mt_device dev,
                         double value, int value_arg) {
    if (ndim > 0 && !shape) {
        mt_error_set(MT_ERR_NULL, "%s: arg 2: shape is NULL", op);
        return NULL;
    }
    if ((unsigned)dt < MT_DTYPE_COUNT && mt_check_fill_value(op, value_arg, dt, value) < 0)
        return NULL;
    mt_tensor *t = mt_tensor_new(op, ndim, shape, dt, dev);
    if (!t) return NULL;
    if (mt_backend_get(dev)->fill(t, value) < 0) {
        mt_tensor_unref(t);
        return NULL;
    }
    return t;
}

mt_tensor *mt_empty(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev) {
    mt_api_enter();
    if (ndim > 0 && !shape) {
        mt_error_set(MT_ERR_NULL, "mt_empty: arg 2: shape is NULL");
        return mt_api_exit(NULL);
    }
    return mt_api_exit(mt_tensor_new("mt_empty", ndim, shape, dt, dev));
}

mt_tensor *mt_zeros(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev) {
    mt_api_enter();
    return mt_api_exit(filled("mt_zeros", ndim, shape, dt, dev, 0.0, 0));
}

mt_tensor *mt_ones(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev) {
    mt_api_enter();
    return mt_api_exit(filled("mt_ones", ndim, shape, dt, dev, 1.0, 0));
}

mt_tensor *mt_full(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev, double value) {
    mt_api_enter();
    return mt_api_exit(filled("mt_full", ndim, shape, dt, dev, value, 5));
}

mt_tensor *mt_scalar(double value, mt_dtype dt, mt_device dev) {
    mt_api_enter();
    return mt_api_exit(filled("mt_scalar", 0, NULL, dt, dev, value, 1));
}

mt_tensor *mt_zeros_like(const mt_tensor *t) {
    if (!t) return NULL;
    mt_api_enter();
    return mt_api_exit(filled("mt_zeros_like", t->ndim, t->shape, t->dtype, t->device, 0.0, 0));
}

mt_tensor *mt_ones_like(const mt_tensor *t) {
    if (!t) return NULL;
    mt_api_enter();
    return mt_api_exit(filled("mt_ones_like", t->ndim, t->shape, t->dtype, t->device, 1.0, 0));
}

mt_tensor *mt_empty_like(const mt_tensor *t) {
    if (!t) return NULL;
    mt_api_enter();
    return mt_api_exit(mt_tensor_new("mt_empty_like", t->ndim, t->shape, t->dtype, t->device));
}

mt_tensor *mt_arange(double start, double end, double step, mt_dtype dt, mt_device dev) {
    mt_api_enter();
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step) ||
        (end - start) / step < 0) {
        mt_error_set(MT_ERR_INVALID,
                     "mt_arange: start %g, end %g, step %g do not describe a finite range", start,
                     end, step);
        return mt_api_exit(NULL);
    }
    double count = ceil((end - start) / step); /* inf when end - start overflows */
    if (!(count <= 0x1p62)) {
        mt_error_set(MT_ERR_SHAPE,
                     "mt_arange: start %g, end %g, step %g make %g elements, too many", start, end,
                     step, count);
        return mt_api_exit(NULL);
    }
    if (!mt_backend_for("mt_arange", dev)) return mt_api_exit(NULL);
    int64_t n = (int64_t)count;
    mt_tensor *t = mt_tensor_new("mt_arange", 1, &n, MT_F64, MT_CPU);
    if (!t) return mt_api_exit(NULL);
    double *p = mt_tensor_data(t);
    for (int64_t i = 0; i < n; i++) p[i] = start + (double)i * step;
    if (dt == MT_F64 && dev.type == MT_DEVICE_CPU) return mt_api_exit(t);
    /* convert on the host, then upload */
    mt_tensor *host = mt_tensor_new("mt_arange", 1, &n, dt, MT_CPU);
    mt_tensor *out = NULL;
    if (host && mt_cpu_backend.copy(host, t) == 0) {
        if (dev.type == MT_DEVICE_CPU) {
            out = mt_tensor_ref(host);
        } else {
            out = mt_tensor_new("mt_arange", 1, &n, dt, dev);
            if (out && mt_backend_get(dev)->upload(out, mt_tensor_data(host)) < 0) {
                mt_tensor_unref(out);
                out = NULL;
            }
        }
    }
    mt_tensor_unref(host);
    mt_tensor_unref(t);
    return mt_api_exit(out);
}

static mt_tensor *random_tensor(const char *op, int ndim, const int64_t *shape, mt_dtype dt,
                                mt_device dev, bool normal) {
    if (ndim > 0 && !shape) {
        mt_error_set(MT_ERR_NULL, "%s: arg 2: shape is NULL", op);
        return NULL;
    }
    if (!mt_dtype_is_floating(dt)) {
        mt_error_set(MT_ERR_DTYPE, "%s: dtype %s is not a floating dtype", op, mt_dtype_name(dt));
        return NULL;
    }
    mt_tensor *t = mt_tensor_new(op, ndim, shape, dt, dev);
    if (!t) return NULL;
    if (mt_scope_reserve() < 0) { /* before the draw: a failed call leaves the generator */
        mt_tensor_unref(t);
        return NULL;
    }
    uint64_t seed, offset;
    mt_rng_reserve((uint64_t)t->numel, &seed, &offset);
    if (mt_backend_get(dev)->random(t, normal, seed, offset) < 0) {
        mt_tensor_unref(t);
        return NULL;
    }
    return t;
}

mt_tensor *mt_rand(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev) {
    mt_api_enter();
    return mt_api_exit(random_tensor("mt_rand", ndim, shape, dt, dev, false));
}

mt_tensor *mt_randn(int ndim, const int64_t *shape, mt_dtype dt, mt_device dev) {
    mt_api_enter();
    return mt_api_exit(random_tensor("mt_randn", ndim, shape, dt, dev, true));
}

mt_tensor *mt_from_data(const void *src, mt_dtype dt, int ndim, const int64_t *shape,
                        mt_device dev) {
    mt_api_enter();
    if (!src) {
        mt_error_set(MT_ERR_NULL, "mt_from_data: arg 1: src is NULL");
        return mt_api_exit(NULL);
    }
    if (ndim > 0 && !shape) {
        mt_error_set(MT_ERR_NULL, "mt_from_data: arg 4: shape is NULL");
        return mt_api_exit(NULL);
    }
    mt_tensor *t = mt_tensor_new("mt_from_data", ndim, shape, dt, dev);
    if (t && mt_backend_get(dev)->upload(t, src) < 0) {
        mt_tensor_unref(t);
        t = NULL;
    }
    return mt_api_exit(t);
}

static int copy_to_host(const mt_tensor *t, void *dst, size_t nbytes) {
    if (!t) return mt_error_set(MT_ERR_NULL, "mt_copy_to_host: arg 1: tensor is NULL");
    if (!dst) return mt_error_set(MT_ERR_NULL, "mt_copy_to_host: arg 2: dst is NULL");
    size_t need = (size_t)t->numel * mt_dtype_size(t->dtype);
    if (nbytes < need)
        return mt_error_set(MT_ERR_INVALID,
                            "mt_copy_to_host: arg 3: buffer of %zu bytes is smaller than the "
                            "tensor's %zu bytes (%lld x %s)",
                            nbytes, need, (long long)t->numel, mt_dtype_name(t->dtype));
    return mt_backend_get(t->device)->download(t, dst);
}

int mt_copy_to_host(const mt_tensor *t, void *dst, size_t nbytes) {
    mt_api_enter(); /* errors inside read "mt_copy_to_host: ..." */
    return mt_api_exit_status(copy_to_host(t, dst, nbytes));
}

static double item(const mt_tensor *t) {
    if (!t) return NAN;
    if (t->numel != 1) {
        char buf[MT_SHAPE_BUF];
        mt_error_set(MT_ERR_SHAPE, "mt_item: tensor of shape %s has %lld elements, expected 1",
                     mt_shape_str(t, buf, sizeof buf), (long long)t->numel);
        return NAN;
    }
    /* convert one element to F64 on the host through the copy kernel */
    mt_tensor *one = mt_tensor_new("mt_item", 0, NULL, MT_F64, MT_CPU);
    if (!one) return NAN;
    mt_tensor *src = mt_tensor_view_of(t, 0, NULL, NULL, t->offset);
    double v = NAN;
    if (src) {
        if (t->device.type == MT_DEVICE_CPU) {
            if (mt_cpu_backend.copy(one, src) == 0) v = *(double *)mt_tensor_data(one);
        } else {
            unsigned char raw[8];
            mt_tensor *host = mt_tensor_new("mt_item", 0, NULL, t->dtype, MT_CPU);
            if (host && mt_backend_get(t->device)->download(src, raw) == 0 &&
                mt_cpu_backend.upload(host, raw) == 0 && mt_cpu_backend.copy(one, host) == 0)
                v = *(double *)mt_tensor_data(one);
            mt_tensor_unref(host);
        }
    }
    mt_tensor_unref(src);
    mt_tensor_unref(one);
    return v;
}

double mt_item(const mt_tensor *t) {
    mt_api_enter(); /* errors inside read "mt_item: ..." */
    double v = item(t);
    mt_api_exit_status(0);
    return v;
}
