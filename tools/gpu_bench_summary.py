"""Summary lines for tools/gpu_test.sh from the JSON lines of bench/gemm and bench/op_overhead
--device cuda: one `STATUS<TAB>NAME<TAB>DETAIL` line per goal check, STATUS PASS, FAIL, NOT RUN
or INFO (figures that no goal covers).

Goals (issue 6): FP16 and BF16 GEMMs at >= 0.60 of the cuBLAS rate measured in the same program
(FP32, TF32 off, is information); tiny-op host time <= 0.5x PyTorch's on the same GPU.
A figure that is missing (null) is a FAIL for mixtape or cuBLAS and NOT RUN for torch; a line
from the emulated device is a FAIL (its timings are not GPU figures), or NOT RUN in the
rehearsal on the emulated device (MT_GPU_REHEARSE=1), which runs the benches for their output.

Usage: gpu_bench_summary.py gemm|op-overhead LOG"""
import json
import os
import sys

GEMM_GOAL = 0.60
OVERHEAD_GOAL = 0.5
# The status of a figure from the emulated device.
EMULATED = "NOT RUN" if os.environ.get("MT_GPU_REHEARSE") == "1" else "FAIL"


def lines(path, bench):
    out = []
    for line in open(path, errors="replace"):
        if line.startswith('{"bench": "%s"' % bench):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def fmt(v, spec="%.1f"):
    return "-" if v is None else spec % v


def gemm(rows):
    info = []
    for r in rows:
        label = "%s %s" % (r["dtype"], r["case"])
        figs = "mixtape %s, cuBLAS %s, torch %s TFLOP/s (%s of torch); max rel diff %s" % (
            fmt(r["mixtape_tflops"]), fmt(r["cublas_tflops"]), fmt(r["torch_tflops"]),
            fmt(r["ratio_torch"], "%.2f"), fmt(r["max_rel_diff"], "%.1e"))
        ratio = r["ratio_cublas"]
        if r["dtype"] == "FP32":
            info.append("%s %s" % (r["case"], fmt(ratio, "%.2f")))
            continue
        if r.get("emulated"):
            yield EMULATED, "gemm", "%s: emulated device, not a GPU figure" % label
        elif ratio is None:
            yield "FAIL", "gemm", "%s: not measured (%s)" % (label, figs)
        else:
            status = "PASS" if ratio >= GEMM_GOAL else "FAIL"
            yield status, "gemm", "%s: %.2f of cuBLAS (goal >= %.2f); %s" % (
                label, ratio, GEMM_GOAL, figs)
    if info:
        emu = "emulated device, not GPU figures: " if any(r.get("emulated") for r in rows) else ""
        yield "INFO", "gemm", emu + "FP32 (TF32 off), of cuBLAS: " + "; ".join(info)


def overhead(rows):
    for r in rows:
        op = r["op"]
        # mixtape_us, torch_us and ratio: host time per call of a short burst (the goal's
        # figure); the *_wall_us: a long run plus a synchronize, device-bound when well above
        figs = "host: mixtape %s us, torch %s us per call; wall: mixtape %s us, torch %s us" % (
            fmt(r["mixtape_us"], "%.2f"), fmt(r["torch_us"], "%.2f"),
            fmt(r.get("mixtape_wall_us"), "%.2f"), fmt(r.get("torch_wall_us"), "%.2f"))
        if r.get("emulated"):
            yield EMULATED, "op-overhead", "%s: emulated device, not a GPU figure" % op
        elif r["mixtape_us"] is None:
            yield "FAIL", "op-overhead", "%s: mixtape not measured" % op
        elif r["ratio"] is None:
            yield "NOT RUN", "op-overhead", "%s: no torch figure (%s)" % (op, figs)
        else:
            status = "PASS" if r["ratio"] <= OVERHEAD_GOAL else "FAIL"
            yield status, "op-overhead", "%s: %.2f of torch (goal <= %.1f); %s" % (
                op, r["ratio"], OVERHEAD_GOAL, figs)


def main():
    kind, path = sys.argv[1], sys.argv[2]
    rows = lines(path, "gemm" if kind == "gemm" else "op_overhead")
    if not rows:
        print("FAIL\t%s\tno JSON lines in the output" % kind)
        return
    for status, name, detail in (gemm(rows) if kind == "gemm" else overhead(rows)):
        print("%s\t%s\t%s" % (status, name, detail))


if __name__ == "__main__":
    main()
