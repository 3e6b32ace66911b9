#!/usr/bin/env bash
# Several h200_run.sh sessions side by side, one per GPU group, then everything in one tarball
# under $OUT (the device tool brings back few files):
#   bash scripts/h200_split.sh "0,1|WS=2|cp-bench cp-train" "2|BENCH_PIPELINE_ARGS=--preset dsv32-128k|bench-pipeline"
# Each spec: GPUS | VAR=VALUE;VAR=VALUE (values may hold spaces) | phases. Each group writes under
# $OUT/g<i>/ and its summary to $OUT/g<i>.txt; the env phase runs once first (it installs the
# carried wheels, which the groups then share).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/hytopk-out}; mkdir -p "$O"
OUT=$O/env bash scripts/h200_run.sh env >/dev/null 2>&1
pids=(); i=0
for spec in "$@"; do
  IFS='|' read -r gpus vars phases <<< "$spec"
  (
    export CUDA_VISIBLE_DEVICES="$gpus" OUT="$O/g$i"
    IFS=';' read -ra kv <<< "$vars"
    for v in "${kv[@]}"; do [ -n "$v" ] && export "$v"; done
    # shellcheck disable=SC2086
    bash scripts/h200_run.sh $phases > "$O/g$i.txt" 2>&1
  ) &
  pids+=($!); i=$((i + 1))
done
for p in "${pids[@]}"; do wait "$p"; done          # wait on the PIDs (a pgrep loop matches itself)
for f in "$O"/g*.txt; do echo "== $f"; cat "$f"; done
tar -C "$O" -czf /tmp/hytopk-all.tgz . && rm -rf "${O:?}"/* && mv /tmp/hytopk-all.tgz "$O/all.tgz"
