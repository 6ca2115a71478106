"""cuheap_wheel: the build backend (PEP 517) behind `pip install .`.

The wheel is the `cuheap` package of scripts/cuheap with libcuheap.so inside
it, built by `make lib`, and a .pth file that turns cuheap on when the
interpreter starts with CUHEAP_TORCH set, so that the environment alone does
it, without PYTHONPATH (it looks at one variable and imports nothing
otherwise). It is written here with the standard library alone, so it builds
offline, without build isolation, and with no setuptools or wheel package:
`pip install --no-build-isolation --no-index .` works in a fresh venv. The
version is CUHEAP_VERSION of include/cuheap.h, as for the pkg-config file.

Only build_wheel is offered: pip builds from the source tree (no sdist), and
editable installs are not supported (use the source tree's scripts/ folder on
PYTHONPATH instead).
"""

import base64
import hashlib
import os
import re
import subprocess
import sys
import sysconfig
import zipfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = os.path.join(_ROOT, "scripts", "cuheap")

# Run by site.py at start-up (a .pth line that starts with "import").
_PTH = ('import os; os.environ.get("CUHEAP_TORCH", "").strip() not in ("", "0") '
        'and __import__("cuheap").activate_from_environment()\n')


def _version():
    with open(os.path.join(_ROOT, "include", "cuheap.h")) as f:
        return re.search(r'#define CUHEAP_VERSION "([^"]+)"', f.read()).group(1)


def _tag():
    platform = re.sub(r"[^\w]", "_", sysconfig.get_platform())
    return "py3-none-" + platform


def _metadata(version):
    return ("Metadata-Version: 2.1\n"
            "Name: cuheap\n"
            "Version: %s\n"
            "Summary: cuheap, a CUDA device-memory allocator, as PyTorch's CUDA allocator\n"
            "License: MIT\n"
            "Requires-Python: >=3.8\n" % version)


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d\n" % (name, digest, len(data))


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build = os.environ.get("BUILD", "build")
    subprocess.run(["make", "-C", _ROOT, "BUILD=" + build, "lib"], check=True, stdout=sys.stderr)
    library = os.path.join(_ROOT, build, "libcuheap.so")
    version = _version()
    dist_info = "cuheap-%s.dist-info" % version
    files = []
    for name in sorted(os.listdir(_PACKAGE)):
        if name.endswith(".py"):
            with open(os.path.join(_PACKAGE, name), "rb") as f:
                files.append(("cuheap/" + name, f.read(), 0o644))
    with open(library, "rb") as f:
        files.append(("cuheap/libcuheap.so", f.read(), 0o755))
    files.append(("cuheap-activate.pth", _PTH.encode(), 0o644))
    files.append((dist_info + "/METADATA", _metadata(version).encode(), 0o644))
    files.append((dist_info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: cuheap_wheel\nRoot-Is-Purelib: false\n"
                                         "Tag: %s\n" % _tag()).encode(), 0o644))
    files.append((dist_info + "/top_level.txt", b"cuheap\n", 0o644))
    record = "".join(_record_line(name, data) for name, data, _ in files) + dist_info + "/RECORD,,\n"
    files.append((dist_info + "/RECORD", record.encode(), 0o644))
    wheel_name = "cuheap-%s-%s.whl" % (version, _tag())
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data, mode in files:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return wheel_name
