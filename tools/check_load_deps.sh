#!/usr/bin/env bash
# Fails when the shared library would need a CUDA library to load: a CPU-only user of a build
# made where the CUDA toolkit exists must be able to load libmixtape (cudart is linked
# statically, cuBLAS is loaded on first use).
set -euo pipefail
lib=$1
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "$lib needs: $(echo $needed)"
if grep -qiE '^lib(cuda|cudart|cublas|cublasLt|cudnn|nccl)[.]' <<<"$needed"; then
    echo "error: loading the library would need a CUDA library" >&2
    exit 1
fi
