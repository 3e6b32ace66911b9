"""`python -m workbench ...` is the `hytopk` CLI."""
import sys
from pathlib import Path

try:
    from .cli import main
except ModuleNotFoundError as e:        # a Python without the CLI's packages (typer, rich): say where they are
    if (e.name or "").split(".")[0] not in ("typer", "rich", "click"):
        raise
    wb = Path(__file__).resolve().parents[1] / "wb"
    args = " ".join(sys.argv[1:])
    print(f"hytopk: this Python ({sys.executable}) cannot run the CLI: {e}.\n"
          + (f"  {wb} {args}    sets up .venv/ with every dependency on first use (about two minutes) and runs it\n"
             if wb.exists() else "")
          + "  or install the CLI's packages into this Python: pip install -e '.[cli]'", file=sys.stderr)
    sys.exit(2)

main()
