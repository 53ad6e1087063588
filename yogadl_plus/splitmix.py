"""splitmix64 (Steele, Lea and Flood, 2014): a keyed 64-bit mixing function, the one source of
pseudo-random bits of the order's Fisher-Yates tables and Feistel rounds and of the pseudo-random
split predicate. Integer arithmetic only, so every machine and numpy version gets the same bits.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["GOLDEN", "MASK64", "MIX_1", "MIX_2", "splitmix64", "splitmix64_array"]

MASK64 = (1 << 64) - 1
#: The state increment: 2**64 divided by the golden ratio, odd.
GOLDEN = 0x9E3779B97F4A7C15
#: The finalizer's multipliers: odd, with good avalanche in the high bits.
MIX_1 = 0xBF58476D1CE4E5B9
MIX_2 = 0x94D049BB133111EB


def splitmix64(state: int) -> int:
    """The output for ``state`` (a uint64 as a Python int); the next state is ``state + GOLDEN``."""
    z = (state + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MIX_1) & MASK64
    z = ((z ^ (z >> 27)) * MIX_2) & MASK64
    return z ^ (z >> 31)


def splitmix64_array(states: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """``splitmix64`` of every element, vectorized; equal to it element by element."""
    # uint64 array arithmetic wraps modulo 2**64 silently, exactly like the masked ints above.
    z = states + np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX_1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX_2)
    return z ^ (z >> np.uint64(31))
