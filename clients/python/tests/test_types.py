"""Guards the package's type hints (it ships py.typed): mypy, pinned, finds no error in it for
the oldest Python it supports."""

from __future__ import annotations

from pathlib import Path

from mypy import api


def test_mypy_finds_no_error():
    src = Path(__file__).resolve().parents[1] / "src" / "faultrouter"
    out, err, status = api.run(["--python-version", "3.10", "--no-incremental", "--cache-dir", "/dev/null", str(src)])
    assert status == 0, out + err
