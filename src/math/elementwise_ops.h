/* The elementwise ops' formulas, listed once: X-macro lists that every backend expands into
   its own loops (src/cpu/cpu_elementwise.c: a vectorisable loop per op; src/cuda/
   elementwise.cu: a kernel per op). Adding an elementwise op is its ops.def row, one line
   here and a test row.

   Each list is stamped for an element type T with the suffix S of the src/math functions
   (float, f: F32, F16 and BF16 storage, arithmetic in FP32; double, d: F64) and calls
   X(ID, COST, EXPR) per op, where ID names MT_OP_<ID> and EXPR is an expression of type T in
   the names the expanding code declares:
     MT_UNARY_FORMULAS   x (the element) and p (the op's scalar argument, as T)
     MT_BINARY_FORMULAS  a and b (the elements; the fused backward ops take a = incoming
                         gradient, b = the saved input x or output y)
   COST is the relative work per element (1: an add; 8: a transcendental), which the CPU
   uses to pick its parallel threshold. MT_COMPARE_FORMULAS calls X(ID, EXPR) with EXPR a
   truth value in a and b, for any arithmetic type (integers compare exactly). */
#ifndef MT_MATH_ELEMENTWISE_OPS_H
#define MT_MATH_ELEMENTWISE_OPS_H
#include "scalar_ops.h"

/* clang-format would read `x * p` in a macro argument as a pointer declaration */
// clang-format off

/* pow_scalar squares with a multiply when p == 2 (exact, and the common case of squared
   errors; the CPU also hoists that branch out of its loop so that the loop vectorises) and
   takes sqrt and rsqrt for 0.5 and -0.5 as torch does. */
#define MT_UNARY_FORMULAS(X, T, S)                                                                 \
    X(NEG, 1, -x)                                                                                  \
    X(EXP, 8, mt_exp_##S(x))                                                                       \
    X(LOG, 8, mt_log_##S(x))                                                                       \
    X(SQRT, 1, mt_sqrt_##S(x))                                                                     \
    X(RSQRT, 1, mt_rsqrt_##S(x))                                                                   \
    X(ABS, 1, mt_abs_##S(x))                                                                       \
    X(SIGN, 1, mt_sign_##S(x))                                                                     \
    X(RELU, 1, mt_relu_##S(x))                                                                     \
    X(GELU, 8, mt_gelu_##S(x))                                                                     \
    X(GELU_TANH, 8, mt_gelu_tanh_##S(x))                                                           \
    X(SIGMOID, 8, mt_sigmoid_##S(x))                                                               \
    X(TANH, 8, mt_tanh_##S(x))                                                                     \
    X(ADD_SCALAR, 1, x + p)                                                                        \
    X(MUL_SCALAR, 1, x * p)                                                                        \
    X(RSUB_SCALAR, 1, p - x)                                                                       \
    X(RDIV_SCALAR, 1, p / x)                                                                       \
    X(POW_SCALAR, 8, mt_pow_scalar_##S(x, p))

#define MT_BINARY_FORMULAS(X, T, S)                                                                \
    X(ADD, 1, a + b)                                                                               \
    X(SUB, 1, a - b)                                                                               \
    X(MUL, 1, a * b)                                                                               \
    X(DIV, 1, a / b)                                                                               \
    X(POW, 8, mt_pow_##S(a, b))                                                                    \
    X(MAXIMUM, 1, mt_max2_##S(a, b))                                                               \
    X(MINIMUM, 1, mt_min2_##S(a, b))                                                               \
    X(RELU_BACKWARD, 1, (T)MT_RELU_GRAD(a, b))                                                     \
    X(GELU_BACKWARD, 8, a * mt_gelu_grad_##S(b))                                                   \
    X(GELU_TANH_BACKWARD, 8, a * mt_gelu_tanh_grad_##S(b))                                         \
    X(SIGMOID_BACKWARD, 1, a * b * ((T)1 - b))                                                     \
    X(TANH_BACKWARD, 1, a * ((T)1 - b * b))

/* BOOL results; cost 1 */
#define MT_COMPARE_FORMULAS(X)                                                                     \
    X(EQ, a == b)                                                                                  \
    X(NE, a != b)                                                                                  \
    X(LT, a < b)                                                                                   \
    X(LE, a <= b)                                                                                  \
    X(GT, a > b)                                                                                   \
    X(GE, a >= b)

// clang-format on
#endif
