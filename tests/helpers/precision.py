"""What a forward computes in: the dtypes seen by LayerNorm, read at the dispatcher (not from our code)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LayerNormDtypes(TorchDispatchMode):
    """Records (input, weight, output) dtypes of every ``native_layer_norm`` the forward computes."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.native_layer_norm.default:
            self.seen.add((str(args[0].dtype), str(args[2].dtype), str(out[0].dtype)))
        return out
