"""Printed and logged ε and δ are rounded up, never down (a rounded-down ε claims more privacy
than was accounted: 8.8434 printed as ``8.843``, or stored by TensorBoard as float32 8.8433…)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from fedsim.privacy.display import epsilon_float32, format_delta, format_epsilon


@pytest.mark.parametrize(
    "eps,digits,style,text",
    [
        (8.843355, 3, "f", "8.844"),  # nearest would print 8.843
        (1.0733, 3, "f", "1.074"),
        (1.073, 3, "f", "1.073"),  # exact values stay
        (2.0, 3, "f", "2.000"),
        (9.9996, 3, "f", "10.000"),
        (8.843355, 3, "g", "8.85"),
        (123.456, 3, "g", "124"),
        (0.0012345, 3, "g", "0.00124"),
        (0.017263, 1, "e", "1.8e-02"),  # δ: nearest would print 1.7e-02
        (0.0006, 1, "e", "6.0e-04"),
    ],
)
def test_known_values_round_up(eps, digits, style, text):
    assert format_epsilon(eps, digits, style) == text


def test_no_printed_value_is_below_the_accounted_one():
    rng = random.Random(0)
    for _ in range(3000):
        x = 10 ** rng.uniform(-6, 3)
        for digits in (1, 2, 3, 4):
            for style in ("f", "g", "e"):
                shown = float(format_epsilon(x, digits, style))
                assert shown >= x, (x, digits, style)
                # and it is the nearest such number at that precision: less than one step above
                step = 10.0**-digits if style == "f" else 10.0 ** (math.floor(math.log10(x)) - digits + (style == "g"))
                assert shown - x <= step * (1 + 1e-9) + 1e-15, (x, digits, style, shown)
        assert float(format_delta(x)) >= x


def test_missing_and_infinite_values():
    assert format_epsilon(None) == "–"
    assert format_epsilon(math.inf) == "inf" and format_epsilon("inf") == "inf"
    assert format_epsilon(0.0) == "0.000"


def test_float32_store_keeps_an_upper_bound():
    x = 8.695755385  # float32 nearest is 8.695755005: below
    assert float(np.float32(x)) < x
    assert epsilon_float32(x) >= x and np.float32(epsilon_float32(x)) == epsilon_float32(x)
    assert epsilon_float32(x) - x < 1e-6
    rng = np.random.default_rng(0)
    for v in rng.uniform(0, 50, 2000):
        assert epsilon_float32(float(v)) >= v


def test_tensorboard_scalars_of_epsilon_and_delta_go_up():
    from fedsim.reporting.tracking import _stored

    x = 8.695755385
    assert _stored("epsilon", x) >= x and _stored("summary/epsilon", x) >= x and _stored("summary/delta", x) >= x
    assert _stored("train_loss", x) == x  # other values as TensorBoard rounds them
