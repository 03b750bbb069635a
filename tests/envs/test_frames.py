"""``gradlab.envs.frames.FrameStack``: conversion values computed by hand, stack order, ownership."""

from __future__ import annotations

import numpy as np

from gradlab.envs.frames import FrameStack


def test_grayscale_is_bt601_luma_in_pil_fixed_point():
    # PIL "L": (R*19595 + G*38470 + B*7471 + 0x8000) >> 16
    # red 255 -> 5029493 >> 16 = 76; green -> 150; blue -> 29.
    rgb = np.zeros((2, 3, 3), dtype=np.uint8)
    rgb[:, 0, 0] = rgb[:, 1, 1] = rgb[:, 2, 2] = 255
    fs = FrameStack(grayscale=True, resize=None, stack=1, in_shape=(2, 3, 3))
    obs = fs.reset(rgb)
    assert obs.shape == (1, 2, 3) and obs.dtype == np.uint8
    assert obs[0].tolist() == [[76, 150, 29], [76, 150, 29]]


def test_bilinear_downscale_by_two_hand_computed():
    # Columns [10, 10, 20, 20] to width 2: PIL's bilinear filter is stretched by the scale (2), so
    # output 0 (centre 1.0) weighs inputs at 0.5, 1.5, 2.5 by 0.75, 0.75, 0.25:
    # (7.5 + 7.5 + 5) / 1.75 = 11.43 -> 11; output 1 (centre 3.0): (2.5 + 15 + 15) / 1.75 = 18.57 -> 19.
    frame = np.array([[10, 10, 20, 20]] * 4, dtype=np.uint8)
    fs = FrameStack(grayscale=True, resize=(2, 2), stack=2, in_shape=(4, 4))
    assert fs.shape == (2, 2, 2)
    obs = fs.reset(frame)
    assert obs.tolist() == [[[11, 19], [11, 19]]] * 2


def test_stack_order_newest_last_and_repeat_last():
    fs = FrameStack(grayscale=True, resize=None, stack=3, in_shape=(2, 2))
    frame = np.full((2, 2), 1, dtype=np.uint8)
    assert fs.reset(frame)[:, 0, 0].tolist() == [1, 1, 1]
    for value, expected in ((2, [1, 1, 2]), (3, [1, 2, 3]), (4, [2, 3, 4])):
        frame[:] = value  # the caller reuses its buffer: the stack must have kept its own copy
        assert fs.push(frame)[:, 0, 0].tolist() == expected
    again = fs.repeat_last()
    assert again[:, 0, 0].tolist() == [2, 3, 4]
    assert fs.reset(np.full((2, 2), 9, dtype=np.uint8))[:, 1, 1].tolist() == [9, 9, 9]


def test_returned_observations_are_the_callers_own():
    fs = FrameStack(grayscale=False, resize=(2, 2), stack=2, in_shape=(4, 4, 3))
    a = fs.reset(np.full((4, 4, 3), 50, dtype=np.uint8))
    assert a.shape == (6, 2, 2) and a.flags.writeable
    a[:] = 0  # writing to one observation changes neither the stack nor the next observation
    b = fs.push(np.full((4, 4, 3), 60, dtype=np.uint8))
    assert b[:3].max() == b[:3].min() == 50 and b[3:].max() == b[3:].min() == 60
    c = fs.repeat_last()
    assert c is not b and np.array_equal(b, c)
    b[:] = 1
    assert fs.repeat_last()[:, 0, 0].tolist() == [50, 50, 50, 60, 60, 60]
