#!/usr/bin/env bash
# One H200 session (device tool): environment, then the named phases, each time-boxed,
# logs under $OUT (tarred at the end so they fit the device tool's file limits).
#   bash scripts/h200_run.sh env tests:330 compare:150 bench-train ...
# Phases: env ncu-kernels (NCU_CASES, NCU_KERNELS) ncu-bytes (the same: DRAM bytes read / written, L2 hit rate, time) tests-plan bench-pipeline (BENCH_PIPELINE_ARGS) probe sass ncu tests-wgmma tests-ws tests-dtypes tests-args prefill bench-core compile-check tests tests-gpu tests-cupy tests-variants tests-torch tests-app tests-new tests-mma-sync tests-numba bench-numba sweep-numba
#         tests-attend bench-attend (BENCH_ATTEND_ARGS) probe-attend (PROBE_ATTEND_ARGS: the op's time split, MHA / MLA)
#         tests-table bench-table probe-phases (PROBE_PHASES_ARGS) (issue 21: the table top-k kernels)
#         sanitize (JOBS=...) compare (PRESET, BUDGET, COMPARE_ARGS) bench-train cp-selftest cp-bench (WS, CP_ARGS)
#         cp-selftest-shared (2 ranks on GPU 0 over gloo) cp-train (WS) tests-cp (tests/test_distributed.py)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hytopk-out}; mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/numpy ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD
S="$OUT/summary.txt"
# numba-cuda kernel launches break with numpy >= 2.5 (the image's): say so first, not as odd failures later
python3 -c "import numpy, sys; v = tuple(map(int, numpy.__version__.split('.')[:2])); sys.exit(v >= (2, 5))" \
  || echo "WARNING numpy $(python3 -c 'import numpy; print(numpy.__version__)') (no .whl/ numpy<2.5 carried): Numba rows and tests will fail" | tee -a "$S"
phase() {   # phase NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  local t0=$(date +%s)
  timeout "$secs" "$@" >"$OUT/logs/$name.log" 2>&1
  local rc=$?
  local tail1; tail1=$(grep -E "passed|failed|error|OK|FAIL|PASS:|BIT-EXACT|WRONG|HGMMA" "$OUT/logs/$name.log" | tail -n 1)
  printf '%-14s rc=%-3s %4ss  %s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$tail1" | tee -a "$S"
}
PYT="python3 -m pytest -q -p no:cacheprovider -rfE --timeout=${TEST_TIMEOUT:-120}"
for arg in "$@"; do      # NAME or NAME:SECONDS (time box for that phase)
  p=${arg%%:*}; unset CAP; [ "$p" != "$arg" ] && CAP=${arg#*:}
  case "$p" in
    env) phase env 60 bash -c 'nvidia-smi; python3 -c "import sys,numpy,numba,cupy,torch; print(sys.version); print(\"numpy\",numpy.__version__,\"numba\",numba.__version__,\"cupy\",cupy.__version__,\"torch\",torch.__version__, torch.cuda.get_device_name())"; python3 -m workbench doctor' ;;
    compile-check) phase compile-check 300 python3 -m workbench compile-check ;;
    tests-cupy) phase tests-cupy ${CAP:-240} $PYT tests/test_cupy_gpu.py tests/test_loader.py tests/test_compile_check.py tests/test_cupy_bf16.py ;;
    tests-variants) phase tests-variants ${CAP:-300} $PYT tests/test_variants.py ;;
    tests-torch) phase tests-torch ${CAP:-120} $PYT tests/test_torch_*.py ;;
    tests-new) phase tests-new ${CAP:-120} $PYT ${NEW_FILES:-tests/test_variants.py tests/test_cupy_gpu.py} -k "${NEW_K:-threshold or mma_sync}" ;;
    probe) phase probe ${CAP:-120} python3 scripts/wgmma_probe.py ;;
    sass) phase sass ${CAP:-240} bash scripts/sass.sh wgmma.cu "$OUT/sass" ;;
    tests-wgmma) phase tests-wgmma ${CAP:-240} $PYT --durations=10 tests/test_wgmma.py tests/test_variants.py -k "wgmma" ;;
    tests-ws) phase tests-ws ${CAP:-300} $PYT --durations=10 tests/test_wgmma_ws.py ;;
    tests-plan) phase tests-plan ${CAP:-240} $PYT --durations=10 tests/test_plan_gpu.py tests/test_plan.py tests/test_torch_gpu.py ;;
    bench-pipeline) phase bench-pipeline ${CAP:-300} python3 scripts/bench_pipeline.py ${BENCH_PIPELINE_ARGS:---preset dsv32-128k --preset glm5-128k} --json "$OUT/bench_pipeline.json" ;;
    tests-dtypes) phase tests-dtypes ${CAP:-200} $PYT -rs --durations=10 tests/test_dtypes_gpu.py ;;
    tests-args) phase tests-args ${CAP:-120} $PYT --durations=5 tests/test_arguments_gpu.py ;;
    prefill) phase prefill ${CAP:-300} python3 -m workbench.torch.integrations.bench_prefill --json "$OUT/prefill.json" ${PREFILL_ARGS:-} ;;
    tests-numba) phase tests-numba ${CAP:-300} $PYT --durations=10 tests/test_numba_tile.py tests/test_numba_ptx.py tests/test_numba_dtypes.py tests/test_variants.py -k "numba or tile" ;;
    bench-numba) phase bench-numba ${CAP:-120} python3 scripts/bench_numba_scorer.py --preset ${PRESET:-dsv32-128k} --json "$OUT/bench_numba_scorer.json" ;;
    sweep-numba) phase sweep-numba ${CAP:-480} python3 scripts/bench_numba_scorer.py --sweep --preset ${PRESET:-dsv32-128k} --json "$OUT/sweep_numba_scorer.json" ;;
    bench-core) phase bench-core ${CAP:-300} python3 scripts/bench_core.py ${BENCH_CORE_ARGS:---preset dsv32-128k --preset glm5-128k} --json "$OUT/bench_core.json" ;;
    ncu-kernels) phase ncu-kernels ${CAP:-400} bash scripts/ncu_kernels.sh "$OUT/logs/ncu" ${NCU_CASES:-table pipeline attend} ;;
    ncu-bytes) phase ncu-bytes ${CAP:-200} ncu --clock-control none -k "${NCU_KERNELS:-regex:hytopk_table_(fused|filter)}" --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum python3 scripts/profile_kernels.py ${NCU_CASES:-table_runs} ;;
    ncu) phase ncu ${CAP:-240} ncu --clock-control none -k regex:"wgmma|_ws" --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy python3 scripts/profile_wgmma.py ;;
    tests-table) phase tests-table ${CAP:-300} $PYT --durations=10 tests/test_table_topk_gpu.py tests/test_table_topk.py tests/test_table_v2.py tests/test_variants.py -k "table or topk or auto or smem" ;;
    probe-phases) phase probe-phases ${CAP:-240} python3 scripts/probe_fused_phases.py --json "$OUT/probe_phases.json" ${PROBE_PHASES_ARGS:-} ;;
    bench-table) phase bench-table ${CAP:-180} python3 scripts/bench_table_topk.py --json "$OUT/table_topk.json" ${BENCH_TABLE_ARGS:-} ;;
    tests-mma-sync) phase tests-mma-sync ${CAP:-120} $PYT tests/test_cupy_gpu.py tests/test_variants.py tests/test_mma_sync_layout.py -k "mma_sync" ;;
    tests-gpu) phase tests-gpu ${CAP:-300} $PYT --durations=15 tests/test_cupy_gpu.py tests/test_variants.py tests/test_torch_gpu.py tests/test_cli_gpu.py tests/test_example.py tests/test_distributed.py tests/test_loader.py tests/test_cupy_bf16.py tests/test_table_topk_gpu.py --junitxml="$OUT/logs/junit-gpu.xml" ;;
    tests-attend) phase tests-attend ${CAP:-420} $PYT --durations=10 tests/test_attention*.py ${ATTEND_K:+-k "$ATTEND_K"} ;;
    tests-attend-swap) phase tests-attend-swap ${CAP:-150} env HYTOPK_ATTW2_V_SWAP=1 $PYT tests/test_attention_wgmma_gpu.py -k "wgmma2s and (exact or reference)" ;;
    probe-attend) phase probe-attend ${CAP:-240} python3 scripts/probe_attention_split.py --json "$OUT/probe_attention_split.json" ${PROBE_ATTEND_ARGS:-} ;;
    bench-attend) phase bench-attend ${CAP:-240} python3 scripts/bench_attention.py ${BENCH_ATTEND_ARGS:-} --json "$OUT/bench_attention.json" ;;
    tests-app) phase tests-app ${CAP:-240} $PYT --durations=10 tests/test_cli_gpu.py tests/test_example.py tests/test_distributed.py ;;
    cp-selftest) phase cp-selftest ${CAP:-120} python3 -m workbench.distributed selftest --backend nccl --world-size "${WS:-2}" ;;
    cp-bench) phase cp-bench ${CAP:-420} python3 -m workbench.distributed bench --world-size "${WS:-2}" --json "$OUT/cp_bench.json" ${CP_ARGS:-} ;;
    cp-selftest-shared) phase cp-selftest-shared ${CAP:-180} python3 -m workbench.distributed selftest --backend gloo-cuda --world-size 2 --family cupy ;;
    cp-train) phase cp-train ${CAP:-180} python3 -m workbench.distributed train --backend nccl --world-size "${WS:-2}" ;;
    tests-cp) phase tests-cp ${CAP:-420} $PYT --durations=10 tests/test_distributed.py tests/test_cp_scaling.py ;;
    tests) phase tests ${CAP:-560} $PYT tests --junitxml="$OUT/logs/junit.xml" ;;
    sanitize) phase sanitize ${CAP:-420} env PYTHON=python3 bash scripts/sanitize.sh ;;
    compare) phase compare ${CAP:-480} python3 -m workbench compare --preset "${PRESET:-dsv32-128k}" --json "$OUT/compare.json" --plot "$OUT/compare.png" ${BUDGET:+--budget $BUDGET} ${COMPARE_ARGS:-} ;;
    compare-*) P=${p#compare-}; phase "$p" ${CAP:-300} python3 -m workbench compare --preset "$P" --json "$OUT/compare-$P.json" ${BUDGET:+--budget $BUDGET} ${COMPARE_ARGS:-} ;;
    bench-train) phase bench-train ${CAP:-480} python3 -m workbench.torch.bench_train ${BENCH_PRESETS:---preset dsv32-32k --preset dsv32-128k} --json "$OUT/bench_train.json" ;;
    *) echo "unknown phase $p" | tee -a "$S" ;;
  esac
done
cp -r results/sanitizer "$OUT/logs/" 2>/dev/null || true
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$OUT/logs"
cat "$S"
