#!/usr/bin/env bash
# Builds FlashMLA's sm90 sparse prefill forward into .ext/libflashmla_sparse_fwd.so, an external
# baseline for scripts/bench_attention.py (loaded by workbench/harness/flashmla.py). Needs nvcc
# (CUDA >= 12.8), a FlashMLA checkout and CUTLASS's include/ (FlashMLA's csrc/cutlass submodule, or
# any recent CUTLASS). Runs on a CPU-only machine (~40 s); the .so is not committed (.gitignore).
#   FLASHMLA_DIR=/path/to/FlashMLA CUTLASS_DIR=/path/to/cutlass bash scripts/external/build_flashmla.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${FLASHMLA_DIR:?set FLASHMLA_DIR to a FlashMLA checkout (github.com/deepseek-ai/FlashMLA)}"
CUTLASS_DIR=${CUTLASS_DIR:-$FLASHMLA_DIR/csrc/cutlass}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
src=$FLASHMLA_DIR/csrc
for f in "$src/sm90/prefill/sparse/phase1.cuh" "$src/kerutils/include/kerutils/kerutils.cuh" "$CUTLASS_DIR/include/cute/tensor.hpp"; do
  [ -f "$f" ] || { echo "build_flashmla: missing $f" >&2; exit 2; }
done
mkdir -p .ext
"$NVCC" -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr --expt-extended-lambda \
  -DNDEBUG -diag-suppress 177,20012 -I"$src" -I"$src/kerutils/include" -I"$CUTLASS_DIR/include" \
  -Xcompiler -fPIC -shared -o .ext/libflashmla_sparse_fwd.so \
  scripts/external/flashmla_sparse_fwd.cu "$src/sm90/prefill/sparse/instantiations/phase1_k576.cu"
# what was built, for the benchmark's JSON (FLASHMLA_REV / CUTLASS_REV: where the dirs are not git checkouts)
rev=${FLASHMLA_REV:-$(git -C "$FLASHMLA_DIR" rev-parse HEAD 2>/dev/null || echo unknown)}
crev=${CUTLASS_REV:-$(git -C "$CUTLASS_DIR" rev-parse HEAD 2>/dev/null || echo unknown)}
printf 'FlashMLA %s, CUTLASS %s, %s\n' "$rev" "$crev" "$("$NVCC" --version | tail -n 1)" > .ext/libflashmla_sparse_fwd.txt
echo "built .ext/libflashmla_sparse_fwd.so: $(cat .ext/libflashmla_sparse_fwd.txt)"
