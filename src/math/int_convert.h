/* Conversions to the integer dtypes, written once for the CPU and CUDA backends so that both
   give the same result for every input, in range or not:
   - from a floating value: truncation toward zero; NaN and values outside the integer's
     range give its minimum (the x86 "integer indefinite" that torch's CPU casts produce).
     A plain C cast is undefined there, and a GPU's conversion saturates instead;
   - from an integer: wraps modulo 2^32 to I32 (two's complement, as torch's
     tensor.to(torch.int32)); never through a double, which loses integers above 2^53. */
#ifndef MT_MATH_INT_CONVERT_H
#define MT_MATH_INT_CONVERT_H
#include <stdint.h>
#include "hd.h"

MT_HD int64_t mt_f64_to_i64(double v) {
    /* -2^63 is exact in a double; 2^63 is the first value past the range */
    return v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? (int64_t)v : INT64_MIN;
}
MT_HD int32_t mt_f64_to_i32(double v) {
    return v > -2147483649.0 && v < 2147483648.0 ? (int32_t)v : INT32_MIN;
}
MT_HD int32_t mt_i64_to_i32(int64_t v) {
    uint32_t low = (uint32_t)(uint64_t)v;
    /* the low 32 bits as two's complement, without an implementation-defined cast */
    return low <= (uint32_t)INT32_MAX ? (int32_t)low : (int32_t)(low - 2147483648u) + INT32_MIN;
}
#endif
