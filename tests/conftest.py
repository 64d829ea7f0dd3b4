"""Without a GPU, Triton kernels run under Triton's interpreter on CPU tensors. The variable is read when a kernel
is defined (`triton.jit`), so it is set before any test module imports one."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
