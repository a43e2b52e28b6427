/* The random digits of a uniform draw stored in a dtype: as many as it holds below 1.0, so
   that storing the draw never rounds it up to 1.0 (F16 11, BF16 8; F32 24, and F64 takes
   the F32 draw). For both backends' mt_rand (cpu_backend.c, copy_fill.cu); apart from
   philox.h, which stays free of the public header (math_check.cu compiles it alone). */
#ifndef MT_MATH_UNIFORM_DIGITS_H
#define MT_MATH_UNIFORM_DIGITS_H
#include "hd.h"
#include "mixtape.h"

MT_HD int mt_uniform_digits(mt_dtype dt) {
    return dt == MT_F16 ? 11 : dt == MT_BF16 ? 8 : 24;
}
#endif
