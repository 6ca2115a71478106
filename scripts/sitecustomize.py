"""sitecustomize: activation of cuheap by environment alone.

With this folder on PYTHONPATH and CUHEAP_TORCH=1, cuheap becomes PyTorch's
CUDA allocator the moment `import torch` finishes, before the program can make
a CUDA tensor: the training script is not changed. Python runs the first
sitecustomize module it finds, so this one then runs the next one on the path,
if any, as the interpreter would have.
"""

import os
import sys


def _chain_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    seen_self = False
    for entry in sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        if folder == here:
            seen_self = True
            continue
        candidate = os.path.join(folder, "sitecustomize.py")
        if seen_self and os.path.isfile(candidate):
            with open(candidate) as f:
                code = compile(f.read(), candidate, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": candidate})
            return


if os.environ.get("CUHEAP_TORCH", "").strip() not in ("", "0"):
    import cuheap_torch   # it reads the value, and says so if it is neither on nor off

    cuheap_torch.activate_from_environment()
_chain_next_sitecustomize()
