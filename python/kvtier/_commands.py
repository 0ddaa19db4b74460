"""kvtierd and cachectl as console commands of kvtier's binary wheel (scripts/build_wheel.py).

The wheel carries both programs in kvtier/bin/, and in kvtier.libs/ the libraries
they load that a manylinux system need not have (auditwheel copied them there and
set the programs' RPATH to find them). A command replaces this Python process with
its program: the same pid, so signals (SIGTERM, SIGHUP) and the exit status are
the program's own. A kvtier built from source (`pip install .`) has no programs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_BIN = Path(__file__).resolve().parent / "bin"


def _run(name: str) -> None:
    program = _BIN / name
    if not os.access(program, os.X_OK):
        sys.exit(f"{name}: this kvtier package has no {name}: a build from source (pip install .) holds the client only; "
                 "install kvtier's binary wheel or its Debian package")
    os.execv(program, [name, *sys.argv[1:]])


def kvtierd() -> None:
    _run("kvtierd")


def cachectl() -> None:
    _run("cachectl")
