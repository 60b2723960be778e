"""Type hints on every public function of vlhub (issue 27): each parameter and the return value of every public
function, and of every public method of a public class, in every module of vlhub is annotated.

The modules are read from their source with `ast` rather than imported: importing all of them takes torch,
transformers and gradio (the app's optional extra), about half a minute on shared cores, where parsing takes a
second; it also reads modules that cannot be imported quietly (`vlhub/app/__main__.py` runs the app), so none is
skipped.
"""

import ast
import pkgutil
from collections.abc import Iterator
from pathlib import Path

# The package's folder, found without importing it (`import vlhub` alone takes torch).
PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "vlhub"
# Dunder methods checked besides the public names: the ones a user calls directly.
CHECKED_DUNDERS = {"__init__", "__call__"}
Function = ast.FunctionDef | ast.AsyncFunctionDef


def module_name(path: Path) -> str:
    return ".".join(("vlhub", *path.relative_to(PACKAGE_ROOT).with_suffix("").parts)).removesuffix(".__init__")


def vlhub_modules() -> dict[str, Path]:
    """Every module of the package, by name: every `.py` file under `vlhub/`, which covers pkgutil's walk of each
    folder (checked) and the folders without an `__init__.py` (namespace packages, which pkgutil's walk does not
    enter: the `evaluate` metric scripts)."""
    files = {module_name(path): path for path in sorted(PACKAGE_ROOT.rglob("*.py"))}
    walked = {
        f"{module_name(folder / '__init__.py')}.{info.name}"
        for folder in {path.parent for path in PACKAGE_ROOT.rglob("__init__.py")}
        for info in pkgutil.iter_modules([str(folder)])
    }
    unreadable = walked - set(files)
    assert not unreadable, f"modules without a source file to read: {sorted(unreadable)}"
    return files


def module_level(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at module (or class) level, those inside `if`/`try` blocks included."""
    for statement in statements:
        if isinstance(statement, ast.If):
            yield from module_level(statement.body + statement.orelse)
        elif isinstance(statement, ast.Try):
            yield from module_level(statement.body + statement.orelse + statement.finalbody)
        else:
            yield statement


def public_functions(statements: list[ast.stmt], prefix: str = "") -> Iterator[tuple[str, Function, bool]]:
    """(qualified name, definition, whether it is a method) for each public function, and each public method
    (dunders in CHECKED_DUNDERS included) of each public class, nested public classes included."""
    for statement in module_level(statements):
        if isinstance(statement, Function):
            if not statement.name.startswith("_") or (prefix and statement.name in CHECKED_DUNDERS):
                yield prefix + statement.name, statement, bool(prefix)
        elif isinstance(statement, ast.ClassDef) and not statement.name.startswith("_"):
            yield from public_functions(statement.body, f"{prefix}{statement.name}.")


def missing_annotations(function: Function, is_method: bool) -> list[str]:
    """The names of the function's unannotated parameters (not a method's `self`/`cls`), and `return` if its return
    is not annotated."""
    arguments = function.args
    positional = arguments.posonlyargs + arguments.args
    decorators = {decorator.id for decorator in function.decorator_list if isinstance(decorator, ast.Name)}
    if is_method and "staticmethod" not in decorators and positional:
        positional = positional[1:]
    parameters = positional + arguments.kwonlyargs + [arguments.vararg, arguments.kwarg]
    missing = [parameter.arg for parameter in parameters if parameter is not None and parameter.annotation is None]
    if function.returns is None:
        missing.append("return")
    return missing


def test_every_module_is_read():
    modules = vlhub_modules()
    for name in ("vlhub", "vlhub.modeling.uniter.modeling_uniter", "vlhub.evaluation.coco_caption.coco_caption"):
        assert name in modules


def test_missing_annotations_are_found():
    tree = ast.parse(
        "def f(a, b: int, *args, **kwargs): pass\n"
        "def _private(a): pass\n"
        "class C:\n"
        "    def __init__(self, a: int) -> None: pass\n"
        "    def m(self, a: int): pass\n"
        "    @staticmethod\n"
        "    def s(a: int) -> int: pass\n"
        "    def _hidden(self, a): pass\n"
        "    class Inner:\n"
        "        def __call__(self, x) -> None: pass\n"
        "class _Private:\n"
        "    def m(self, a): pass\n"
    )
    found = {name: missing_annotations(function, method) for name, function, method in public_functions(tree.body)}
    assert found == {
        "f": ["a", "args", "kwargs", "return"],
        "C.__init__": [],
        "C.m": ["return"],
        "C.s": [],
        "C.Inner.__call__": ["x"],
    }


def test_every_public_function_is_annotated():
    """Every public function (each parameter and the return) is annotated: a new function without hints fails."""
    failures = []
    checked = 0
    for name, path in vlhub_modules().items():
        for qualname, function, is_method in public_functions(ast.parse(path.read_text(), str(path)).body):
            checked += 1
            missing = missing_annotations(function, is_method)
            if missing:
                failures.append(f"{name}:{qualname}: {', '.join(missing)}")
    assert checked > 500, f"only {checked} functions found: the walk missed modules"
    assert not failures, f"{len(failures)} of {checked} public functions lack annotations:\n" + "\n".join(failures)
