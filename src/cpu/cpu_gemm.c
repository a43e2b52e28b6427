/* PLACEHOLDER: not implemented yet; replaced by its owner before anything lands. */
#include <math.h>
#include "cpu.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

int mt_cpu_gemm(mt_tensor *c, const mt_tensor *a, const mt_tensor *b, double alpha, double beta) { return mt_error_set(MT_ERR_UNSUPPORTED, "mt_cpu_gemm: not implemented yet"); }
