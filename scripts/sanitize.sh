#!/usr/bin/env bash
# Run a small subset of the CuPy GPU tests under compute-sanitizer (memcheck and
# racecheck) and print a summary. Needs a GPU; run from the repo root on the H200:
#   bash scripts/sanitize.sh            (log files land in results/sanitizer/)
set -uo pipefail
cd "$(dirname "$0")/.."
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
PY=${PYTHON:-python}
OUT=results/sanitizer
mkdir -p "$OUT"
# small shapes only: sanitizers slow kernels down 10-100x
SUBSET=(
  "tests/test_cupy_gpu.py::test_table_pipeline_matches_reference[full-relu_plateau]"
  "tests/test_cupy_gpu.py::test_table_pipeline_matches_reference[causal_tail-specials]"
  "tests/test_cupy_gpu.py::test_table_pipeline_matches_reference[edge-alias_between_samples]"
  "tests/test_cupy_gpu.py::test_indexer_exact_matches_reference"
  "tests/test_cupy_gpu.py::test_select_is_bitwise_deterministic_on_ties"
  "tests/test_cupy_gpu.py::test_score_only_checksum_is_sum_of_order_keys"
)
status=0
for tool in ${TOOLS:-memcheck racecheck}; do
  log="$OUT/$tool.log"
  echo "== compute-sanitizer --tool $tool"
  HYPOTHESIS_PROFILE=ci "$SAN" --tool "$tool" --target-processes all --print-limit 20 \
      --error-exitcode 99 "$PY" -m pytest -q -x -p no:cacheprovider "${SUBSET[@]}" >"$log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error SUMMARY" "$log" | tail -1)
  tests=$(grep -E "[0-9]+ (passed|failed)" "$log" | tail -1)
  echo "   exit $rc | ${summary:-no sanitizer summary line} | ${tests:-no pytest summary}"
  [ $rc -ne 0 ] && status=1
done
echo "logs: $OUT/memcheck.log $OUT/racecheck.log"
exit $status
