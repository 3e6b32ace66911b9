#!/usr/bin/env bash
# SASS of one .cu's shipped instantiations (needs nvcc + cuobjdump, e.g. on the H200 machine):
#   bash scripts/sass.sh wgmma.cu OUTDIR   -> OUTDIR/<file>.sass and a count of the matrix instructions
set -euo pipefail
cd "$(dirname "$0")/.."
f=${1:-wgmma.cu}; out=${2:-/tmp}; mkdir -p "$out"
python3 - "$f" "$out" <<'PY'
import subprocess, sys
from pathlib import Path
from workbench import instantiations as INST
from workbench.compile_check import instantiation_unit
f, out = sys.argv[1], Path(sys.argv[2])
src = Path("kernels_cuda") / f
unit = out / f"inst_{src.stem}.cu"
unit.write_text(instantiation_unit(src.resolve(), INST.name_expressions(f)))
target = INST.nvcc_target(f, "90")
subprocess.run(["nvcc", "-std=c++17", "-O3", "-cubin", target, f"-I{src.parent}", str(unit),
                "-o", str(out / f"{src.stem}.cubin")], check=True)
PY
cuobjdump --dump-sass "$out/${f%.cu}.cubin" > "$out/${f%.cu}.sass"
echo "$f: $(grep -c 'HGMMA' "$out/${f%.cu}.sass") HGMMA, $(grep -c 'QGMMA' "$out/${f%.cu}.sass") QGMMA, $(grep -c 'HMMA' "$out/${f%.cu}.sass") HMMA, $(grep -cE 'LDL|STL' "$out/${f%.cu}.sass") LDL/STL, $(grep -c 'WARPGROUP' "$out/${f%.cu}.sass") WARPGROUP"
