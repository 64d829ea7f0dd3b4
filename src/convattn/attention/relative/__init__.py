"""Relative position terms as lightweight convolutions (Chang et al. 2021), one engine for every mechanism.

bias.py holds the O(n x (2r + 1)) tables; decomposition.py, blockwise.py, flex.py and the dense bias compute
attention with them; kernels.py has the fused kernels decomposition.py calls per device; dispatch.py chooses.
"""

from convattn.attention.relative.bias import RelativePositionBias, alibi_slopes, position_bias, relative_columns
from convattn.attention.relative.dispatch import attention_per_sequence, relative_attention, relative_path

__all__ = ["RelativePositionBias", "alibi_slopes", "attention_per_sequence", "position_bias", "relative_attention",
           "relative_columns", "relative_path"]
