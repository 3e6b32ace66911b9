"""The winners file: the fastest correct variant per stage for each preset / shape
class, written by `compare` and read by the PyTorch export (`load`).

Location: $HYTOPK_WINNERS, else ~/.cache/hytopk/winners.json (XDG_CACHE_HOME honoured).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

VERSION = 1


def path() -> Path:
    env = os.environ.get("HYTOPK_WINNERS")
    if env:
        return Path(env)
    return _default_path()


def _default_path() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "hytopk" / "winners.json"


def read(p: Path | None = None) -> dict:
    """The winners file's content ({"version", "entries"}; empty when there is no file yet).
    A directory, an unreadable file or one that is not a winners file is a ValueError naming it."""
    p = Path(p) if p else path()
    if p.is_dir():
        raise ValueError(f"winners file {p} is a directory; give a file path")
    if not p.exists():
        return {"version": VERSION, "entries": {}}
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"winners file {p} is not valid JSON ({e.msg} at line {e.lineno}); "
                         f"fix or delete it") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read winners file {p}: {getattr(e, 'strerror', None) or e}") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or not all(isinstance(e, dict) and isinstance(e.get("stages", {}), dict)
                                                for e in entries.values()):
        raise ValueError(f"winners file {p} is not a winners file (expected a JSON object "
                         f"{{\"version\": {VERSION}, \"entries\": {{preset: {{\"stages\": ...}}}}}}); "
                         f"fix or delete it")
    if data.get("version") != VERSION:
        raise ValueError(f"winners file {p}: version {data.get('version')!r}, expected {VERSION}")
    return data


def check_recordable(p: Path | None = None) -> Path:
    """Before a run that will record winners: the file reads (or does not exist yet) and can be
    written. The default cache folder is created; a folder named by HYTOPK_WINNERS or ``p``
    must exist. Returns the absolute path; a ValueError naming the file otherwise."""
    from .report import check_writable
    env = os.environ.get("HYTOPK_WINNERS")
    if p is not None:
        p, what, explicit = Path(p), "winners file", True
    elif env:
        p, what, explicit = Path(env), "HYTOPK_WINNERS", True
    else:
        p, what, explicit = _default_path(), "winners file", False
    if not explicit:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"{what}: cannot create {p.parent}: {e.strerror or e}") from None
    p = check_writable(p, what)
    read(p)
    return p


def record(preset: dict, device: str, gpu: str | None, commit: str | None, date: str, winners: dict,
           stages_run=None, p: Path | None = None) -> Path:
    """Merge this run's winners into the file. Only the stages this run compared
    are replaced, so `compare --stage X` leaves the other stages' winners alone."""
    p = Path(p) if p else path()
    data = read(p)
    entry = data["entries"].get(preset["name"], {"stages": {}, "by_source": {}})
    keep = set(stages_run) if stages_run is not None else None
    for s, name in winners["stages"].items():
        if keep is None or s in keep:
            entry["stages"][s] = name
    for key, v in winners["by_source"].items():
        if keep is None or key.split("[")[0] in keep:
            entry["by_source"][key] = v
    if winners.get("pipeline"):
        entry["pipeline"] = winners["pipeline"]
    entry.update(shape={k: preset[k] for k in ("n", "L", "H", "D", "k", "layout", "dtype")},
                 device=device, gpu=gpu, commit=commit, date=date)
    data["entries"][preset["name"]] = entry
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, p)                   # readers never see half a file
    return p


def load(preset_or_shape, p: Path | None = None) -> dict:
    """{stage: variant_name} for a preset name, or for a shape dict
    ({"L":..., "H":..., "D":..., "k":..., "dtype":...}): the entry with the same
    H, D, k (and input dtype when given: bf16 winners round float32 inputs) and
    the nearest L (log scale). {} when nothing fits."""
    entries = read(p)["entries"]
    if isinstance(preset_or_shape, str):
        e = entries.get(preset_or_shape)
        return dict(e["stages"]) if e else {}
    shape = dict(preset_or_shape)
    fits = [e for e in entries.values()
            if all(e.get("shape", {}).get(k) == shape[k] for k in ("H", "D", "k", "dtype") if k in shape)]
    if not fits:
        return {}
    L = shape.get("L")
    if L:
        fits = [e for e in fits if e.get("shape", {}).get("L")] or fits[:0]
        if not fits:
            return {}
        fits.sort(key=lambda e: abs(math.log(e["shape"]["L"]) - math.log(L)))
    return dict(fits[0]["stages"])


def table(data: dict, p: Path | None = None):
    from rich.markup import escape
    from rich.table import Table
    t = Table(title=f"winners ({escape(str(p or path()))})")
    for c in ("preset", "shape", "device", "stage", "fastest correct variant", "time ms"):
        t.add_column(c)
    for name, e in sorted(data["entries"].items()):
        shp = e.get("shape", {})
        first = True
        rows = sorted(e.get("by_source", {}).items())
        for key, v in rows:
            t.add_row(name if first else "", f"n={shp.get('n')} L={shp.get('L')} H={shp.get('H')} k={shp.get('k')}"
                      if first else "", (e.get("gpu") or e.get("device") or "") if first else "",
                      escape(key), v["variant"], f"{v['time_ms']:.4g}")
            first = False
        if e.get("pipeline"):
            t.add_row(name if first else "", "", "", "pipeline", e["pipeline"], "")
    return t
