"""`python -m workbench ...` is the `hytopk` CLI."""
from .cli import main

main()
