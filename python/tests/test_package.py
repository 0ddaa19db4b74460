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
