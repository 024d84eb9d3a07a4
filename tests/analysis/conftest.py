"""Fixtures: the tiny hand-computed run of ``rundir_fixtures`` written to a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from rundir_fixtures import tiny_extents, write_run


@pytest.fixture
def tiny_run(tmp_path) -> Path:
    return write_run(tmp_path / "run")


@pytest.fixture
def tiny_run_extents(tmp_path) -> Path:
    return write_run(tmp_path / "run", extents=tiny_extents())
