"""HyTopK Workbench: kernels for learned-sparse-attention top-k, their variants,
the harness that checks and times them, and their export to PyTorch."""
from .pipeline import Backend, backend
from .registry import STAGES, Variant, register, variants

__all__ = ["backend", "Backend", "variants", "register", "STAGES", "Variant"]
__version__ = "0.1.0"
