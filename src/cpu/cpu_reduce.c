/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "cpu.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

int mt_cpu_reduce(mt_op_id op, mt_tensor *out, const mt_tensor *a, uint32_t mask) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_cpu_reduce: not implemented yet"); }
