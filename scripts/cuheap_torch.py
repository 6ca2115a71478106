"""cuheap_torch: the name cuheap's PyTorch helper had before it became the
`cuheap` package (scripts/cuheap, or `pip install .`). Programs that
`import cuheap_torch`, and `python -m cuheap_torch script.py`, go on working:
importing this module gives the package itself, one module under both names,
so that there is one copy of the code and of its state.
"""

import sys

import cuheap

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.stderr.write("usage: python -m cuheap_torch SCRIPT [ARGS...]\n")
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    sys.exit(cuheap.main(sys.argv, prog="cuheap_torch"))
sys.modules[__name__] = cuheap
