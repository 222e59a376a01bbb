"""The embedded digits are read from scikit-learn's own file, without importing scikit-learn.

Why: importing scikit-learn (with scipy) cost ~1.5 s of CPU in every process that built a
digits stream, each sweep point included (``streams.digits.digits_arrays``). The arrays must
stay ``sklearn.datasets.load_digits``'s exactly, with or without the file where this
release keeps it.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sklearn.datasets import load_digits

from cfl_bench.streams import digits


def test_the_file_gives_load_digits_arrays_exactly() -> None:
    assert digits.sklearn_digits_file() is not None  # the fast path is the one tested
    images, target = digits.digits_arrays()
    bunch = load_digits()
    assert images.shape == (1797, 8, 8) and target.shape == (1797,)
    assert np.array_equal(images, bunch.images) and np.array_equal(target, bunch.target)
    assert images.max() == 16 and sorted(set(target.tolist())) == list(range(10))


def test_without_the_file_load_digits_gives_the_same_arrays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast = digits.digits_arrays()
    monkeypatch.setattr(digits, "sklearn_digits_file", lambda: None)
    slow = digits.digits_arrays()
    assert all(np.array_equal(a, b) for a, b in zip(fast, slow, strict=True))


def test_building_the_digits_imports_no_scikit_learn() -> None:
    code = (
        "import sys; from cfl_bench.streams.digits import digits_images; "
        "splits = digits_images(); assert splits.train_x.shape == (1437, 1, 8, 8); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
