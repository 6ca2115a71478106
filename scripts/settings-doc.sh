#!/usr/bin/env bash
# settings-doc.sh BUILD_DIR - prints docs/settings.md: a fixed paragraph on the
# CUHEAP_CONF syntax, then the table of keys exactly as the code prints it
# (cuheap-replay --settings, from the one option table in src/config.c), so the
# page cannot drift from the code. `make settings-doc` writes the page;
# tests/test_readme.sh checks that the committed page is what this prints.
set -euo pipefail
build=${1:-build}
cat <<'MD'
# Settings: `CUHEAP_CONF`

Every setting of cuheap, whichever way it is used. This page is written by
`make settings-doc` (`scripts/settings-doc.sh`) from the option table in `src/config.c`:
edit the table there, not this page.

`CUHEAP_CONF="key:value,key:value"`, the syntax of `PYTORCH_CUDA_ALLOC_CONF`. Sizes are
bytes with an optional K, M, G or T (binary units). An unknown key or a bad value stops the
program with a message that names it and lists the valid keys. `cuheap_configure()` takes
the same string before the first allocation; `cuheap-replay --conf` too. The launcher's
`cuheap --conf KEY:VALUE,...` adds its settings after those already in `CUHEAP_CONF` (a key
given twice takes the last value) and refuses a bad one before the command starts, with the
same message; `cuheap --report PATH` is `report:PATH`.

MD
"$build/cuheap-replay" --settings
