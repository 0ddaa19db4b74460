"""The package around the native module: its version, its error classes, and
the type stub that lets type checkers see kvtier._native."""

import ast
import pathlib
import re

import kvtier
import kvtier._native

HERE = pathlib.Path(__file__).resolve().parent
STUB = HERE.parent / "kvtier" / "_native.pyi"


def test_the_version_is_the_projects():
    cmake = (HERE.parents[1] / "CMakeLists.txt").read_text()
    project = re.search(r"project\(kvtier VERSION ([0-9.]+)", cmake).group(1)
    assert kvtier.__version__ == project == kvtier._native.__version__


def test_every_status_has_its_error_class_exported():
    codes = {c.code for c in kvtier.Error.__subclasses__()}
    assert {"not_found", "unavailable", "internal", "timeout"} <= codes
    for cls in kvtier.Error.__subclasses__():
        if cls.__module__ == "kvtier":
            assert cls.__name__ in kvtier.__all__ and getattr(kvtier, cls.__name__) is cls
    try:
        kvtier.Client(socket="/nonexistent/kvtierd.sock", connect_timeout=0.1)
    except kvtier.UnavailableError as e:
        assert type(e) is kvtier.UnavailableError and e.code == "unavailable"


def _stub():
    """The stub's top-level names, and each class's member names."""
    tree = ast.parse(STUB.read_text())
    names, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            members[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)} | {
                n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    return names, members


def test_the_stub_names_everything_the_native_module_has():
    names, members = _stub()
    public = {n for n in dir(kvtier._native) if not n.startswith("_")} | {"__version__"}
    assert names == public
    for name in public:
        obj = getattr(kvtier._native, name)
        if isinstance(obj, type):
            have = {m for m in vars(obj) if not m.startswith("_")}
            have |= {m for m in ("__enter__", "__exit__", "__len__") if m in vars(obj)}
            if (vars(obj)["__init__"].__doc__ or "").startswith("__init__("):  # A constructor Python may call.
                have.add("__init__")
            assert members[name] == have, name


def test_the_torch_modules_import_without_transformers():
    """kvtier.paged (the vLLM connector's copies) and kvtier.link need torch at
    most: with transformers unimportable they still import, and kvtier.hf is
    not pulled in. (kvtier.vllm imports vLLM, which needs transformers itself;
    what it imports of kvtier is these modules.)"""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class NoTransformers:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'transformers' or name.startswith('transformers.'):\n"
        "            raise ImportError('transformers is not installed here')\n"
        "sys.meta_path.insert(0, NoTransformers())\n"
        "import kvtier.paged, kvtier.link, kvtier._vllm_saver\n"
        "assert 'kvtier.hf' not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules)\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    try:
        import importlib.util

        has_vllm = importlib.util.find_spec("vllm") is not None
    except ImportError:
        has_vllm = False
    if has_vllm:  # The connector itself does not pull in kvtier.hf.
        code = "import sys, kvtier.vllm\nassert 'kvtier.hf' not in sys.modules\nprint('ok')\n"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
