"""bench.digitize_glfc_figures on hand-made pixel columns: the marker rules, hand-computed."""

from __future__ import annotations

import numpy as np
import pytest

from bench.digitize_glfc_figures import METHODS, Panel, fit, read_marker

WHITE = (255, 255, 255)
PANEL = Panel(left=0, right=99, top=0, bottom=399, frame_bottom=401.0)
SS_IL, GLFC, BIC = 5, 6, 1  # indices in METHODS (drawing order)


def canvas(*bands: tuple[int, int, int]) -> np.ndarray:
    """A white 400 x 100 image with (first row, last row, method) bands across all columns."""
    image = np.full((400, 100, 3), WHITE, dtype=np.uint8)
    for first, last, method in bands:
        image[first : last + 1, :] = METHODS[method][1]
    return image


def test_the_calibration_line_and_its_largest_residual() -> None:
    # rows 100, 200, 301 for 70, 60, 50 %: mean row 200.333, Sxx 20200.67, Sxy -2010, so
    # slope -0.0995017, intercept 79.9335; residuals -0.0167, +0.0332, -0.0165
    line = fit([100, 200, 301], [70, 60, 50])
    assert (line.a, line.b) == (pytest.approx(79.9335, abs=1e-4), pytest.approx(-0.0995017))
    assert line.err == pytest.approx(0.0332, abs=1e-4)
    assert line.pixel(60.0) == pytest.approx(200.333, abs=1e-3)


def test_a_marker_seen_whole_is_centred_on_its_run() -> None:
    image = canvas((150, 249, GLFC))  # 100 px tall, background above and below
    reading = read_marker(image, PANEL, 50.0, GLFC, height=100.0, symmetric=True)
    assert (reading.status, reading.row, reading.height) == ("visible", 199.5, 100)


def test_a_marker_covered_at_one_end_is_sized_from_the_other() -> None:
    # GLFC (drawn last) covers SS-IL's rows 200-229: SS-IL's run is 130-199 and GLFC lies
    # beyond its bottom end, so only the top is an edge: centre 130 + (100 - 1) / 2.
    image = canvas((130, 229, SS_IL), (200, 260, GLFC))
    reading = read_marker(image, PANEL, 50.0, SS_IL, height=100.0, symmetric=True)
    assert reading.status == "one-edge"
    assert reading.row == pytest.approx(130 + 99 / 2)


def test_an_earlier_method_beyond_an_end_does_not_hide_it() -> None:
    # BiC (drawn before SS-IL) touching SS-IL's run leaves SS-IL's edges its own
    image = canvas((50, 149, BIC), (150, 249, SS_IL))
    reading = read_marker(image, PANEL, 50.0, SS_IL, height=100.0, symmetric=True)
    assert (reading.status, reading.row) == ("visible", 199.5)


def test_a_marker_covered_at_both_ends_is_left_out() -> None:
    image = canvas((150, 249, BIC), (140, 170, GLFC), (230, 260, SS_IL))
    reading = read_marker(image, PANEL, 50.0, BIC, height=100.0, symmetric=True)
    assert (reading.status, reading.row) == ("hidden", None)
