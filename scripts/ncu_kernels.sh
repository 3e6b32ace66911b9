#!/usr/bin/env bash
# ncu over scripts/profile_kernels.py (one launch of each kernel of the open issues' targets):
# the detailed sections per kernel, then the SASS lines with the most stall samples per kernel.
#   bash scripts/ncu_kernels.sh OUTDIR [case ...]
set -uo pipefail
out=${1:?OUTDIR}; shift
mkdir -p "$out"
rx=${NCU_KERNELS:-'regex:hytopk_(select|table|threshold|attend|replay)'}
ncu --clock-control none -k "$rx" --set full --import-source no -f -o /tmp/ncu_kernels \
    python3 scripts/profile_kernels.py "$@" >"$out/ncu_run.log" 2>&1
ncu --import /tmp/ncu_kernels.ncu-rep --print-summary none > "$out/sections.txt" 2>&1
ncu --import /tmp/ncu_kernels.ncu-rep --page source --csv --print-source sass > "$out/source.csv" 2>&1
ls -la "$out"
