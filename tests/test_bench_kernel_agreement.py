"""bench/kernel_agreement.py: the pieces that decide what it reports (issue 33); the whole
script runs in ~4.5 minutes on the CPU (``--tiny``), too long for the suite."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import kernel_agreement as ka  # noqa: E402


def test_kernel_agreement_runs_the_kernels_interpreted_on_the_cpu():
    assert ka.interpreted("kernels.loss_head=dueling_padded kernels.target_head=pallas") == (
        "kernels.loss_head=dueling_padded_interpret kernels.target_head=interpret"
    )
    assert ka.interpreted("kernels.loss_head=pallas optim.lr=0.001") == (
        "kernels.loss_head=interpret optim.lr=0.001"
    )
    # settings that are already interpreted, or not kernels, pass unchanged
    assert ka.interpreted("kernels.target_head=interpret") == "kernels.target_head=interpret"


def test_kernel_agreement_difference_is_relative_to_the_reference_s_largest_value():
    ref = np.array([[1.0, -4.0], [2.0, 0.5]])
    got = ref + np.array([[0.0, 0.0], [0.2, 0.0]])
    assert ka.relative(got, ref) == pytest.approx(0.2 / 4.0)
    assert ka.relative(ref, ref) == 0.0
    assert ka.relative(np.ones(3), np.zeros(3)) == pytest.approx(1e12)  # a zero reference
