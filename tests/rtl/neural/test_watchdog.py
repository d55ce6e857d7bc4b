# amaranth: UnusedElaboratable=no
"""The watchdog (npu.neural.watchdog): expires after exactly ``timeout`` cycles without
movement while running."""

import random

import pytest

from npu.neural.watchdog import Watchdog
from tests.support.csr import run


@pytest.mark.parametrize("timeout", [1, 5, 37])
def test_counts_still_cycles(timeout):
    dut = Watchdog(timeout)
    rng = random.Random(timeout)

    async def tb(ctx):
        still = 0           # the model: running cycles in a row without movement
        for _ in range(600):
            run_, moved = rng.random() < 0.9, rng.random() < 0.04
            assert ctx.get(dut.expired) == (still == timeout)
            ctx.set(dut.run, run_)
            ctx.set(dut.moved, moved)
            await ctx.tick()
            still = min(timeout, still + 1) if run_ and not moved else 0

    run(dut, tb)


def test_bad_timeout():
    with pytest.raises(ValueError, match="timeout must be a positive integer"):
        Watchdog(0)
