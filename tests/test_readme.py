"""The README's Python examples run as written (CPU path)."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_python_block_runs(i):
    if "torch" in BLOCKS[i]:
        pytest.importorskip("torch")
    exec(compile(BLOCKS[i], f"README.md[python block {i}]", "exec"), {})


def test_readme_opens_with_the_two_commands():
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1)
    assert [line.split()[0:2] for line in first_block.strip().splitlines()] == [["./wb", "compare"], ["./wb", "test"]]


def test_readme_commands_write_results_only_where_git_ignores_them():
    """`--json`/`--plot` paths in the README's commands (and the PNG beside a JSON) land in a
    folder .gitignore lists, never loose in the checkout."""
    ignored = {ln.strip().rstrip("/") for ln in (README.parent / ".gitignore").read_text().splitlines()}
    commands = "\n".join(re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S))
    paths = re.findall(r"--(?:json|plot)\s+(\S+)", commands)
    assert paths
    for p in paths:
        assert p.startswith("/") or p.split("/")[0] in ignored, p
