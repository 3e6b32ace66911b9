"""Hypothesis profiles and GPU/simulator markers.

HYPOTHESIS_PROFILE=ci (default; derandomised, few examples: CI on 2 cores)
HYPOTHESIS_PROFILE=dev (many more examples, random seeds: development)
HYPOTHESIS_PROFILE=sanitize (3 examples: runs under compute-sanitizer)
"""
import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                      HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=40, derandomize=True, print_blob=True, **_common)
settings.register_profile("dev", max_examples=400, print_blob=True, **_common)
settings.register_profile("sanitize", max_examples=3, derandomize=True, print_blob=True, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
