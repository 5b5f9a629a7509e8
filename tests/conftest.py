"""Test environment: offline, no telemetry, temp dirs for Flower and Ray, one thread."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_TMP = Path(tempfile.mkdtemp(prefix="fedsim-tests-"))
for key, value in {
    "FLWR_TELEMETRY_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "FLWR_HOME": str(_TMP / "flwr"),
    "RAY_TMPDIR": str(_TMP / "ray"),
    "FEDSIM_CACHE": str(_TMP / "cache"),
    "RAY_DEDUP_LOGS": "0",
}.items():
    os.environ.setdefault(key, value)
for d in ("flwr", "ray", "cache"):
    (_TMP / d).mkdir(parents=True, exist_ok=True)
