"""Shared pytest set-up: import the collection as ``ansible_collections.gpuops.repurpose``."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# .collections/ansible_collections/gpuops/repurpose is a symlink to ROOT
sys.path.insert(0, os.path.join(ROOT, ".collections"))
