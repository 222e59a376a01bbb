"""Shared pytest fixtures.

``shared_data`` points at the real offline datasets that live beside the checkout
(``<checkout>/../shared/data``); CI provides that folder, so tests skip only when it is
genuinely absent, with a reason that says where it was looked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder holding MNIST/raw, cifar-10-batches-py, ... in their standard layouts."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets folder {SHARED_DATA} is absent (CI provides it)")
    return SHARED_DATA
