"""The attn_implementation of convattn's own fused kernel, in a module without torch, so that the config, the
attention modules and the modeling code saved beside a model (remote_code.py) all read the one name."""

# the fused Triton kernel (attention/relative/triton_attention.py): on CUDA, or on CPU under the interpreter
TRITON_IMPLEMENTATION = "convattn_triton"
