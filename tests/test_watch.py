"""`hytopk watch`: a copy of a Numba kernel module is edited in a temporary
folder and each save is picked up: correct -> wrong (bad edit) -> compile error
(loop keeps going) -> correct (fixed). Driven directly through the loop body,
then once through real file events (watchdog) and once by polling.

Runs in a child process with NUMBA_ENABLE_CUDASIM=1 (the simulator must be set
before numba is imported)."""
from __future__ import annotations

import json

import pytest

from workbench import registry

from _cli_util import ROOT, run_script

pytestmark = pytest.mark.sim

DRIVER = r'''
import json, shutil, sys, time
from pathlib import Path
from workbench.harness.watch import WatchLoop, Watcher

tmp = Path(sys.argv[1])
src = Path("workbench/families/numba/check.py")
kernel = tmp / "check.py"
shutil.copy(src, kernel)
original = kernel.read_text()
assert "n_c < k" in original, "the check kernel changed: update the edit below"
said = []
loop = WatchLoop(stage="check", say=lambda m: said.append(str(m)))

def step(tag, outs):
    print(json.dumps({"tag": tag, "outs": [o.as_dict() for o in outs]}), flush=True)

step("original", loop.on_change(kernel))
kernel.write_text(original.replace("n_c < k", "n_c < capacity"))
step("broken", loop.on_change(kernel))
kernel.write_text(original.replace("def query_failed", "def query_failed(:"))
step("syntax", loop.on_change(kernel))
kernel.write_text(original)
step("fixed", loop.on_change(kernel))

# real file events: the watcher thread calls the loop body on its own
for poll in (False, True):
    got = []
    w = Watcher([tmp], lambda p: got.extend(loop.on_change(p)), poll=poll, say=lambda m: None).start()
    time.sleep(1.0)
    kernel.write_text(original.replace("n_c < k", "n_c < capacity"))
    t0 = time.time()
    while not got and time.time() - t0 < 30:
        time.sleep(0.1)
    w.stop()
    step("event-poll" if poll else "event-watchdog", got)
    kernel.write_text(original)
print(json.dumps({"tag": "said", "lines": said}))
'''


def test_watch_picks_up_edits_of_a_numba_kernel_copy(tmp_path):
    if not registry.load_family("numba") and "numba" in (registry.load_error("numba") or "").lower():
        pytest.skip(f"numba family not importable: {registry.load_error('numba')}")
    (tmp_path / "k").mkdir()
    p = run_script(DRIVER, tmp_path, sim=True, args=[tmp_path / "k"], timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    steps = {d["tag"]: d for d in map(json.loads, p.stdout.strip().splitlines())}

    def block(tag):
        outs = [o for o in steps[tag]["outs"] if o["variant"] == "numba.check.block"]
        assert outs, (tag, steps[tag])
        return outs[0]
    assert block("original")["correct"] is True and block("original")["time_ms"] > 0
    assert block("original")["change"] == "(first run)"
    broken = block("broken")
    assert broken["correct"] is False and "failed" in broken["detail"]
    assert "True -> False" in broken["change"]
    (syntax,) = steps["syntax"]["outs"]
    assert syntax["variant"] is None and "SyntaxError" in syntax["detail"]
    fixed = block("fixed")
    assert fixed["correct"] is True and "False -> True" in fixed["change"]
    assert block("event-watchdog")["correct"] is False
    assert block("event-poll")["correct"] is False
    said = "\n".join(steps["said"]["lines"])
    assert "WRONG" in said and "SyntaxError" in said


def test_source_file_names_map_to_stages():
    from pathlib import Path
    from workbench.harness.watch import stage_of_source
    assert stage_of_source(Path("filter_mma.cu")) == ["filter"]
    assert stage_of_source(Path("select.cu")) == ["select"]
    assert set(stage_of_source(Path("hytopk_score.cuh"))) == set(registry.STAGES)
