/* Device type -> kernel table. */
#include "backend.h"

#ifdef MT_WITH_CUDA
extern const mt_backend mt_cuda_backend;
#endif

const mt_backend *mt_backend_get(mt_device dev) {
    if (dev.type == MT_DEVICE_CPU) return &mt_cpu_backend;
#ifdef MT_WITH_CUDA
    if (dev.type == MT_DEVICE_CUDA && mt_cuda_available() && dev.index >= 0 &&
        dev.index < mt_cuda_device_count())
        return &mt_cuda_backend;
#endif
    return NULL;
}

const mt_backend *mt_backend_for(const char *op, mt_device dev) {
    const mt_backend *be = mt_backend_get(dev);
    if (!be) {
        if (dev.type == MT_DEVICE_CUDA)
            mt_error_set(MT_ERR_DEVICE, "%s: device cuda:%d is not available (%s)", op, dev.index,
                         mt_cuda_available() ? "no such device index"
                                             : "no CUDA device or driver, or built without CUDA");
        else
            mt_error_set(MT_ERR_DEVICE, "%s: invalid device type %d", op, dev.type);
    }
    return be;
}
