"""`pip install .` builds and installs a working kvtier module: run by CTest
(python_pip_install) with the build environment's interpreter, offline (no
build isolation: the environment has scikit-build-core and pybind11)."""

import os
import subprocess
import sys
import tempfile


def main():
    source = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="kvtier-pip-") as target:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                        "--no-index", "--target", target, source], check=True)
        # A fresh interpreter that sees only the installed copy (not the build tree's).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = target
        code = f"""
import os
import kvtier, kvtier.hf
assert os.path.dirname(kvtier.__file__).startswith({target!r}), kvtier.__file__
try:
    kvtier.Client(socket="/nonexistent/kvtierd.sock", connect_timeout=0.1)
    raise SystemExit("connected to nothing")
except kvtier.UnavailableError as e:
    print("unavailable as expected:", e)
print("installed kvtier", kvtier.PROTOCOL_VERSION)
"""
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=target)


if __name__ == "__main__":
    main()
