"""What a faster reader costs in answers: its slot distributions against a reference reader's on the same reads.

Used to report FP8 experts against bf16 (benchmarks) and to hold the tiny
model's FP8 path to a bound (tests): the mean KL divergence of the label
distributions, KL(reference || candidate), and how often both put the most
probability on the same label.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from canvasread.canvas.reader import CanvasRead, Reader
from canvasread.canvas.readout import slot_reading


@dataclass(frozen=True)
class ReadAgreement:
    slots: int
    mean_kl: float
    max_kl: float
    argmax_agreement: float


def read_agreement(reference: Reader, candidate: Reader, reads: Sequence[CanvasRead]) -> ReadAgreement:
    """Both readers read `reads`; every slot's label distribution is compared."""
    divergences: list[float] = []
    agreeing = 0
    for want_read, got_read in zip(reference.read(reads), candidate.read(reads), strict=True):
        for want_slot, got_slot in zip(want_read, got_read, strict=True):
            want = slot_reading(want_slot.label_logprobs).probabilities
            got = slot_reading(got_slot.label_logprobs).probabilities
            divergences.append(sum(p * math.log(p / max(q, 1e-30)) for p, q in zip(want, got, strict=True) if p > 0))
            agreeing += max(range(len(want)), key=want.__getitem__) == max(range(len(got)), key=got.__getitem__)
    count = max(len(divergences), 1)
    return ReadAgreement(len(divergences), sum(divergences) / count, max(divergences, default=0.0), agreeing / count)
