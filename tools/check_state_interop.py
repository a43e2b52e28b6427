#!/usr/bin/env python3
"""Checks that a safetensors file written by mixtape reads back in Python's safetensors
package and in PyTorch with the same values, bit for bit. It drives libmixtape through ctypes:
makes tensors of every dtype (and a transposed view, a 0-d and an empty tensor) from known
arrays, puts them in an mt_state with metadata, saves with mt_state_save, then reads the file
with safetensors.numpy, safetensors.torch and safetensors.safe_open and compares with the
arrays it started from. CI does not run Python; run it by hand:

  /usr/bin/python3 -m venv --system-site-packages /tmp/stvenv && /tmp/stvenv/bin/pip install safetensors
  /tmp/stvenv/bin/python tools/check_state_interop.py build-dev [checkpoint.safetensors ...]

Extra arguments are checkpoints written by the samples (--save): they are opened with both
readers, their tensors listed, and PyTorch's load_file must agree with safe_open bit for bit.
"""
import ctypes
import os
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file as torch_load

MT_F32, MT_F16, MT_BF16, MT_F64, MT_I64, MT_I32, MT_BOOL = range(7)


class Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("index", ctypes.c_int)]


def lib(build):
    L = ctypes.CDLL(os.path.join(build, "libmixtape.so"))
    L.mt_from_data.restype = ctypes.c_void_p
    L.mt_from_data.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                               ctypes.POINTER(ctypes.c_int64), Device]
    L.mt_transpose.restype = ctypes.c_void_p
    L.mt_transpose.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    L.mt_state_new.restype = ctypes.c_void_p
    L.mt_state_put.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    L.mt_state_set_meta.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    L.mt_state_save.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    L.mt_state_free.argtypes = [ctypes.c_void_p]
    L.mt_release.argtypes = [ctypes.c_void_p]
    L.mt_last_error.restype = ctypes.c_char_p
    return L


def check(L, ok, what):
    if not ok:
        sys.exit("FAIL: %s: %s" % (what, L.mt_last_error().decode()))


def expected():
    """name -> (mixtape dtype, numpy array of the raw values, torch dtype)"""
    r = np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7.0 - 1.5
    return {
        "w.f32": (MT_F32, r.astype(np.float32), torch.float32),
        "w.f16": (MT_F16, r.astype(np.float16), torch.float16),
        # bf16 as its bit patterns: round-to-nearest-even of the f32 values, as torch does
        "w.bf16": (MT_BF16, torch.tensor(r, dtype=torch.float32).to(torch.bfloat16)
                   .view(torch.int16).numpy(), torch.bfloat16),
        "w.f64": (MT_F64, r, torch.float64),
        "step.i64": (MT_I64, np.array([-(2**62), 0, 2**62 + 3], dtype=np.int64), torch.int64),
        "idx.i32": (MT_I32, np.array([[-(2**31), 5], [2**31 - 1, -5]], dtype=np.int32), torch.int32),
        "mask.bool": (MT_BOOL, np.array([True, False, False, True]), torch.bool),
        "scalar": (MT_F32, np.array(3.25, dtype=np.float32), torch.float32),
        "empty": (MT_F32, np.zeros((0, 5), dtype=np.float32), torch.float32),
    }


def write(L, path, exp):
    s = L.mt_state_new()
    cpu = Device(0, 0)
    held = []
    for name, (dt, arr, _) in exp.items():
        a = np.require(arr, requirements="C")  # ascontiguousarray would make 0-d 1-d
        shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        t = L.mt_from_data(a.ctypes.data, dt, a.ndim, shape, cpu)
        check(L, t, "mt_from_data " + name)
        check(L, L.mt_state_put(s, name.encode(), t) == 0, "mt_state_put " + name)
        held.append(t)
    # a non-contiguous view is written in logical order
    tr = L.mt_transpose(held[0], 0, 2)
    check(L, L.mt_state_put(s, b"w.f32.transposed", tr) == 0, "put transposed")
    held.append(tr)
    check(L, L.mt_state_set_meta(s, b"format", b"pt") == 0, "meta")
    check(L, L.mt_state_set_meta(s, b"note", "résumé \"quoted\"".encode()) == 0, "meta")
    check(L, L.mt_state_save(s, path.encode()) == 0, "mt_state_save")
    for t in held:
        L.mt_release(t)
    L.mt_state_free(s)


def bits(t):
    """raw bytes of a torch tensor"""
    t = t.contiguous()
    if t.dtype == torch.bool:
        return t.numpy().tobytes()
    w = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(w).numpy().tobytes() if t.numel() else b""


def verify(path, exp):
    exp = dict(exp)
    f32 = exp["w.f32"][1]
    exp["w.f32.transposed"] = (MT_F32, np.ascontiguousarray(f32.transpose(2, 1, 0)), torch.float32)
    tl = torch_load(path)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        keys = list(f.keys())
        so = {k: f.get_tensor(k) for k in keys}
    assert meta == {"format": "pt", "note": "résumé \"quoted\""}, meta
    assert sorted(keys) == sorted(exp), keys
    # numpy has no bfloat16: every other tensor is read through the numpy framework too
    with safe_open(path, framework="np") as f:
        npd = {k: f.get_tensor(k) for k in keys if exp[k][2] != torch.bfloat16}
    for name, (_, arr, tdt) in exp.items():
        t = tl[name]
        assert t.dtype == tdt and tuple(t.shape) == arr.shape, (name, t.dtype, t.shape)
        want = arr.tobytes()
        assert bits(t) == want, name + ": torch values differ"
        assert bits(so[name]) == want, name + ": safe_open values differ"
        if name in npd:
            assert npd[name].shape == arr.shape and npd[name].tobytes() == want, name + ": numpy"
    print("  %d tensors, every dtype, metadata: safetensors.torch.load_file, safe_open (pt) and "
          "safe_open (numpy, all but bf16) read the values bit for bit" % len(exp))


def check_checkpoint(path):
    tl = torch_load(path)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        for k in f.keys():
            assert bits(f.get_tensor(k)) == bits(tl[k]), k
    print("  %s: %d tensors, %d metadata keys, readable by safetensors and PyTorch" %
          (path, len(tl), len(meta)))
    for k in sorted(tl)[:12]:
        print("    %-28s %-14s %s" % (k, str(tl[k].dtype), list(tl[k].shape)))
    # train_mlp's model loads into the same PyTorch module, strictly
    model = {k: v for k, v in tl.items() if k.startswith("fc")}
    if sorted(model) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]:
        m = torch.nn.Module()
        m.fc1 = torch.nn.Linear(*reversed(model["fc1.weight"].shape))
        m.fc2 = torch.nn.Linear(*reversed(model["fc2.weight"].shape))
        m.load_state_dict(model, strict=True)
        print("    the model loads into torch.nn.Module(fc1=Linear, fc2=Linear) with strict=True")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    L = lib(sys.argv[1])
    exp = expected()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "mixtape.safetensors")
        write(L, path, exp)
        print("mixtape -> %s" % path)
        verify(path, exp)
    for p in sys.argv[2:]:
        check_checkpoint(p)
    print("OK")


if __name__ == "__main__":
    main()
