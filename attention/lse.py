"""Log-sum-exp bases: treecoll's states carry the natural log; FlashInfer and the Triton tutorial's kernels
use base 2 (``exp2``/``log2`` are the fast instructions). The two constants and the conversions at the boundary.

>>> import math, torch
>>> LOG2E == 1 / math.log(2), LN2 == math.log(2)
(True, True)
>>> lse = torch.tensor([0.0, math.log(8.0), float("-inf")])   # ln of a sum of exps: 1, 8, nothing
>>> to_base2(lse).tolist()                                      # log2 of the same sums
[0.0, 3.0, -inf]
>>> torch.equal(to_natural_log(to_base2(lse)), lse)
True
"""

from __future__ import annotations

import torch

__all__ = ["LN2", "LOG2E", "to_base2", "to_natural_log"]

#: log2(e): multiply a natural-log quantity by this to get base 2.
LOG2E = 1.4426950408889634
#: ln(2): multiply a base-2 quantity by this to get natural log.
LN2 = 0.6931471805599453


def to_natural_log(lse_base2: torch.Tensor) -> torch.Tensor:
    """Convert a base-2 LSE (FlashInfer, Triton tutorial) to natural log (float32);
    ``-inf`` stays ``-inf``."""
    return lse_base2.float() * LN2


def to_base2(lse: torch.Tensor) -> torch.Tensor:
    """Convert a natural-log LSE to base 2 (float32); ``-inf`` stays ``-inf``."""
    return lse.float() * LOG2E
