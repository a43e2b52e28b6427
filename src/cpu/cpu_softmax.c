/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "cpu.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

int mt_cpu_softmax(mt_tensor *out, const mt_tensor *a, int dim, bool log) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_cpu_softmax: not implemented yet"); }
int mt_cpu_softmax_backward(mt_tensor *grad_in, const mt_tensor *grad_out, const mt_tensor *y, int dim, bool log) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_cpu_softmax_backward: not implemented yet"); }
int mt_cpu_cross_entropy(mt_tensor *loss, mt_tensor *lse, const mt_tensor *logits, const mt_tensor *labels, int64_t ignore_index, int64_t *valid) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_cpu_cross_entropy: not implemented yet"); }
int mt_cpu_cross_entropy_backward(mt_tensor *grad_logits, const mt_tensor *logits, const mt_tensor *labels, const mt_tensor *lse, const mt_tensor *scale, int64_t ignore_index) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_cpu_cross_entropy_backward: not implemented yet"); }
