"""`pip install .` builds and installs a working kvtier module (with its
version, type stub and kvtier-serve console script): run by CTest
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
print("installed kvtier", kvtier.__version__, kvtier.PROTOCOL_VERSION)
# The version is the package metadata's, which is the CMake project's.
import importlib.metadata, re
cmake = open(os.path.join({source!r}, "CMakeLists.txt")).read()
assert kvtier.__version__ == importlib.metadata.version("kvtier") == kvtier._native.__version__ == re.search(
    r"project\\(kvtier VERSION ([0-9.]+)", cmake).group(1), kvtier.__version__
# Type checkers see the native module: the marker and the stub are installed beside it.
here = os.path.dirname(kvtier.__file__)
assert os.path.isfile(os.path.join(here, "py.typed")) and os.path.isfile(os.path.join(here, "_native.pyi"))
# The console script names kvtier.serve's main.
(serve,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "kvtier-serve"]
assert serve.value == "kvtier.serve:main", serve
"""
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=target)
        # The console script pip wrote runs kvtier.serve's main (its --help needs only argparse).
        script = os.path.join(target, "bin", "kvtier-serve")
        assert os.path.isfile(script), os.listdir(target)
        help_text = subprocess.run([sys.executable, script, "--help"], check=True, env=env, cwd=target,
                                   capture_output=True, text=True).stdout
        assert "--model" in help_text, help_text
        check_extras(target)


def check_extras(target: str) -> None:
    """Every extra (hf, serve, events) names what its modules import, and the
    pinned environment satisfies each requirement: `pip install 'kvtier[serve]'`
    resolves to versions this suite tested. Then each extra's modules import."""
    import importlib.metadata

    from packaging.requirements import Requirement

    (dist,) = importlib.metadata.distributions(path=[target], name="kvtier")
    extras = {}
    for text in dist.requires or []:
        req = Requirement(text)
        for extra in ("hf", "serve", "events"):
            if req.marker is not None and req.marker.evaluate({"extra": extra}):
                extras.setdefault(extra, []).append(req)
    assert set(extras) == {"hf", "serve", "events"}, extras
    for extra, reqs in extras.items():
        for req in reqs:
            if req.name == "kvtier":
                continue  # kvtier[hf] within serve: checked as hf.
            installed = importlib.metadata.version(req.name)
            assert req.specifier.contains(installed, prereleases=True), f"kvtier[{extra}]: {req} but {installed}"
    names = {extra: sorted(r.name for r in reqs) for extra, reqs in extras.items()}
    print("extras:", names)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = target + os.pathsep + os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))
    for modules in ("kvtier.hf", "kvtier.serve", "kvtier.events"):
        subprocess.run([sys.executable, "-c", f"import {modules}"], check=True, env=env, cwd=target)


if __name__ == "__main__":
    main()
