from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


@pytest.fixture
def write(tmp_path):
    """write(name, text) -> path of a file with exactly ``text`` in it."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return _write


@pytest.fixture
def shared_traces() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/traces is not available")
    return SHARED
