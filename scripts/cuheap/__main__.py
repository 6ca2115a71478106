"""python -m cuheap [SCRIPT [ARGS...]]: runs SCRIPT with cuheap as PyTorch's
CUDA allocator, or, with no script, says which libcuheap.so would be loaded
and how cuheap is turned on (cuheap.main)."""

import sys

from cuheap import main

sys.exit(main(sys.argv))
