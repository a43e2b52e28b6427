"""Golden cases with +inf, -inf and NaN among the inputs of the ops that reduce or select
(GEMM, linear and its fused activations, convolution, pooling, softmax, cross entropy, MSE),
forward and gradients, and the gradients of the element-wise ops at their special points, called by tools/gen_golden.py after its element-wise edge cases: every
device must reproduce torch's non-finite results, not only its finite ones. (The
normalisations' cases are in gen_golden_nn.py; this runs after it, for argmax's file.) A convolution's weights stay finite: a
non-finite weight on a tap over the padding gives NaN where an implementation multiplies the
padding's zeros and nothing where it skips the tap, and libraries differ there."""
import torch
import torch.nn.functional as F

from golden_common import F16, F32, NAMES, gen_for, make

INF, NAN = float("inf"), float("nan")
CL = torch.channels_last


def _poison(t, spots):
    """A copy of t with the elements at the flat indices of spots ({index: value}) replaced."""
    t = t.clone()
    flat = t.view(-1)
    for i, v in spots.items():
        flat[i] = v
    return t


def _gemm_cases(add):
    for dt in (F32, F16):
        g = gen_for("matmul_nonfinite_" + NAMES[dt])
        a = _poison(make(g, (3, 4), dt), {1: INF, 6: NAN})
        b = _poison(make(g, (4, 5), dt), {13: -INF})
        add("matmul", NAMES[dt], lambda x: torch.matmul(x[0], x[1]), [a, b])
    g = gen_for("linear_nonfinite_f32")
    x = _poison(make(g, (3, 4), F32), {1: INF, 6: NAN})
    w, b = make(g, (5, 4), F32), _poison(make(g, (5,), F32), {2: -INF})
    add("linear", "f32", lambda t: F.linear(*t), [x, w, b])
    # relu(-inf) is 0 and its gradient 0; relu(NaN) is NaN and passes its gradient
    for code, name, act in ((1, "relu", F.relu), (2, "gelu", F.gelu)):
        g = gen_for("linear_act_nonfinite_" + name)
        x = _poison(make(g, (3, 4), F32), {1: INF, 6: NAN, 8: -INF})
        w, b = make(g, (5, 4), F32), make(g, (5,), F32)
        add("linear_act", name + "_f32", lambda t, a=act: a(F.linear(*t)), [x, w, b],
            params={"act": code})


def _conv_pool_cases(add):
    spots = {5: INF, 40: NAN, 77: -INF}
    for cl in (False, True):
        layout = "nhwc" if cl else "nchw"
        g = gen_for("conv2d_nonfinite_" + layout)
        x = _poison(make(g, (2, 3, 6, 5), F32), spots)
        w, b = make(g, (4, 3, 3, 3), F32), make(g, (4,), F32)
        params = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1}
        if cl:
            params["channels_last"] = [0]
        add("conv2d", layout + "_f32",
            lambda t, cl=cl: F.conv2d(t[0].to(memory_format=CL) if cl else t[0], t[1], t[2],
                                      1, 1), [x, w, b], params=params)
        # max pooling: a NaN wins its windows (and takes their gradient), +inf wins the rest
        for op in ("max_pool2d", "avg_pool2d"):
            g = gen_for("%s_nonfinite_%s" % (op, layout))
            x = _poison(make(g, (2, 3, 7, 8), F32), spots)
            params = {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "ceil_mode": False,
                      "count_include_pad": True}
            if cl:
                params["channels_last"] = [0]

            def fn(t, cl=cl, op=op):
                v = t[0].to(memory_format=CL) if cl else t[0]
                return getattr(F, op)(v, 3, 2, 1)
            add(op, layout + "_f32", fn, [x], params=params)
        g = gen_for("adaptive_avg_pool2d_nonfinite_" + layout)
        x = _poison(make(g, (2, 3, 7, 8), F32), spots)
        params = {"output_size": [3, 4]}
        if cl:
            params["channels_last"] = [0]
        add("adaptive_avg_pool2d", layout + "_f32",
            lambda t, cl=cl: F.adaptive_avg_pool2d(t[0].to(memory_format=CL) if cl else t[0],
                                                   (3, 4)), [x], params=params)


def _softmax_loss_cases(add):
    # rows: +inf among finite values, NaN, -inf among finite values, all finite
    for op, f in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
        for dt in (F32, F16):
            g = gen_for("%s_nonfinite_%s" % (op, NAMES[dt]))
            a = _poison(make(g, (4, 5), dt), {1: INF, 7: NAN, 13: -INF})
            add(op, NAMES[dt], lambda x, f=f: f(x[0], -1), [a], params={"dim": -1})
    g = gen_for("ce_nonfinite")
    logits = _poison(make(g, (5, 4), F32), {1: INF, 7: NAN, 13: -INF})
    add("cross_entropy", "f32", lambda x: F.cross_entropy(x[0], x[1]),
        [logits, torch.tensor([0, 3, 2, 1, 2])])
    g = gen_for("mse_nonfinite")
    p = _poison(make(g, (3, 4), F32), {1: INF, 6: NAN})
    t = _poison(make(g, (3, 4), F32), {9: -INF})
    add("mse_loss", "grad_f32", lambda x: F.mse_loss(x[0], x[1]), [p, t])


def nonfinite_cases(files):
    by = {fo.op: fo for fo in files}

    def add(op, name, fn, inputs, **kw):
        by[op].case("nonfinite_" + name, fn, inputs, **kw)

    _gemm_cases(add)
    _conv_pool_cases(add)
    _softmax_loss_cases(add)
    _special_grad_cases(add)


def _special_grad_cases(add):
    """Gradients at the special points of the element-wise ops: zeros of both signs, +-inf,
    NaN, ties of maximum/minimum (torch splits the gradient), a zero divisor, pow at 0."""
    def t(v):
        return torch.tensor(v, dtype=torch.float64).to(F32)

    special = [0.0, -0.0, -1.0, INF, -INF, NAN, 1e-30, 3.0]
    unary = (("neg", torch.neg), ("exp", torch.exp), ("log", torch.log), ("sqrt", torch.sqrt),
             ("rsqrt", torch.rsqrt), ("abs", torch.abs), ("relu", torch.relu),
             ("sigmoid", torch.sigmoid), ("tanh", torch.tanh), ("gelu", F.gelu),
             ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")))
    for op, f in unary:
        add(op, "special_grad_f32", lambda x, f=f: f(x[0]), [t(special)])
    bin2 = lambda f: (lambda x: f(x[0], x[1]))  # noqa: E731
    for op, f in (("maximum", torch.maximum), ("minimum", torch.minimum)):
        add(op, "ties_grad_f32", bin2(f), [t([1.0, -0.0, 2.0, NAN, INF, 3.0]),
                                            t([1.0, 0.0, 5.0, 1.0, INF, NAN])])
    # argmax: a NaN is the largest value (its first index wins), ties take the first index
    x = t([[1.0, NAN, 3.0, NAN], [INF, 2.0, INF, 1.0], [-INF, -INF, -INF, -INF],
           [0.0, -0.0, 0.0, -1.0]])
    for dim in (0, 1):
        add("argmax", "dim%d_f32" % dim, lambda v, d=dim: torch.argmax(v[0], dim=d), [x],
            params={"dim": dim, "keepdim": 0})
    add("div", "special_grad_f32", bin2(torch.div), [t([1.0, 0.0, INF, 2.0, NAN, -3.0]),
                                                      t([0.0, 0.0, 2.0, INF, 1.0, -0.0])])
    add("pow", "special_grad_f32", bin2(torch.pow), [t([0.0, 0.0, 0.0, 2.0, -2.0, 1.0]),
                                                      t([2.0, 0.5, 0.0, -1.0, 2.0, INF])])
