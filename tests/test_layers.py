"""The import-linter contracts of pyproject.toml hold: layers, no torch in the simulator, kernels a library."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports not found: install the test extra (pip install -e '.[test]')")
    run = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, f"import contracts broken:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"
