# %% [markdown]
# # The kernel engineer's loop, in one IPython session
#
# Load a stage variant, edit its kernel, reload it without restarting, run the
# property check against the reference, compare it with the other variants and
# pick the winner. It is an IPython-style session: the `# %%` markers are cells
# (IPython's %run, Jupyter / VS Code "Run Cell"), and the whole file also runs as a
# script:
#
#     python examples/workbench_loop.py
#
# On a machine without a CUDA driver the Numba variants run in the CUDA simulator:
# the first cell sets NUMBA_ENABLE_CUDASIM=1 itself before numba is imported, and
# says so (CI runs it that way).
# The edit works on a *copy* of the kernel module in a temporary folder, so the
# tree is never touched. The same reload is what `hytopk watch` does on every save.

# %%
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HYTOPK_WINNERS", str(Path(tempfile.mkdtemp()) / "winners.json"))  # keep ~/.cache clean

from workbench.harness.doctor import numba_cuda_mode

simulated = numba_cuda_mode() == "simulator"     # before numba is imported: no GPU -> the CUDA simulator

import numpy as np
from hypothesis import given, settings, strategies as st

import reference as R
import workbench
from workbench import registry
from workbench.harness import winners
from workbench.harness.compare import run_compare
from workbench.harness.report import compare_table
from workbench.harness.watch import WatchLoop
from rich.console import Console

console = Console(width=160)
print("Numba variants run in the", "CUDA simulator" if simulated else "GPU (or are skipped without one)")

# %% [markdown]
# ## 1. Load a stage: every variant of `check` the registry knows

# %%
for v in workbench.variants("check"):
    print(f"{v.name:24s} gpu_only={v.gpu_only!s:5s} {v.notes}")
variant = registry.get("numba.check.block")

# %% [markdown]
# ## 2. Edit its kernel (a copy), reload it, and see it go wrong
# `WatchLoop.on_change` re-imports the saved module under its package name,
# re-registers its variants, checks them against the reference and times them.

# %%
work = Path(tempfile.mkdtemp())
kernel = work / "check.py"
shutil.copy(ROOT / "workbench" / "families" / "numba" / "check.py", kernel)
original = kernel.read_text()

loop = WatchLoop(stage="check", say=console.print)
before = loop.on_change(kernel)                      # the unedited copy: correct

kernel.write_text(original.replace("n_c < k", "n_c < capacity"))   # k and capacity mixed up
broken = loop.on_change(kernel)
print("after the bad edit, correct =", [o.correct for o in broken])

# %% [markdown]
# ## 3. Property check: the edited variant against the reference stage on random counts
# (the full suite is `python -m pytest tests/test_variants.py`; this is the quick version)

# %%
def property_check(max_examples=12):
    v = registry.get("numba.check.block")
    fam = workbench.pipeline.get_family("numba")
    failures = []

    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None)
    @given(st.integers(1, 5), st.integers(1, 8), st.data())
    def prop(n, k, data):
        c = np.array(data.draw(st.lists(st.integers(0, 3 * k), min_size=n, max_size=n)), np.int64)
        count = np.array([data.draw(st.integers(0, int(ci))) for ci in c], np.int32)
        lo = np.zeros(n, np.int32)
        hi = c.astype(np.int32)
        cap = k + data.draw(st.integers(0, 4))
        want_failed, want_rows = R.stage_check(count, lo, hi, k, cap)
        failed, rows = v(fam.to_device(count), fam.to_device(lo), fam.to_device(hi), k, cap)
        got_failed = fam.to_host(failed).astype(bool)
        got_rows = np.sort(fam.to_host(rows))
        if not (np.array_equal(got_failed, want_failed) and np.array_equal(got_rows, want_rows)):
            failures.append((count.tolist(), c.tolist(), k, cap))
            raise AssertionError(f"check differs for count={count.tolist()} c={c.tolist()} k={k} capacity={cap}")
    try:
        prop()
        return True
    except AssertionError as e:
        print("property check failed:", str(e).splitlines()[0])
        return False


print("broken kernel passes the property check:", property_check())

# %% [markdown]
# ## 4. Fix the edit, reload, check again

# %%
kernel.write_text(original)
fixed = loop.on_change(kernel)
ok = property_check()
print("fixed kernel passes the property check:", ok)

# %% [markdown]
# ## 5. Compare the stage's variants side by side and pick the winner

# %%
res = run_compare("tiny", stages=["check"], say=print)
console.print(compare_table(res))
best = res.winners["stages"]["check"]
print("fastest correct check variant:", best)
winners.record(res.preset, res.device, None, None, res.environment["date"], res.winners, stages_run=["check"])
print("winners for tiny:", winners.load("tiny"))

# %% [markdown]
# ## 6. Use the winner: a backend with that variant for the stage

# %%
be = workbench.backend(best.split(".")[0], variants={"check": best})
rng = np.random.default_rng(0)
scores = rng.standard_normal((3, 300)).astype(np.float32)
lo, hi = np.zeros(3, np.int32), np.array([10, 200, 300], np.int32)
got = be.hytopk(scores, lo, hi, 8)
want = R.topk(scores, lo, hi, 8)
print(be)
print("exact top-k:", np.array_equal(got.idx, want[0]) and np.array_equal(got.val, want[1]))

# %%
# what CI asserts when it runs this file
assert all(o.correct for o in before) and not all(o.correct for o in broken)
assert all(o.correct for o in fixed) and ok
assert all(r.correct for r in res.rows)
assert np.array_equal(got.idx, want[0])
print("example finished: OK")
