"""Imports run one way: the lower layers of vlhub never import the higher ones (read from the source, nothing run).

registry.py (the declarations everything looks architectures up in) imports nothing of vlhub; training/ (which the
architectures' objectives build on) imports neither the architectures (vlhub.modeling) nor the package's face
(`vlhub/__init__.py`, which imports vlhub.modeling to register it).
"""

import ast
from pathlib import Path

import pytest

VLHUB = Path(__file__).resolve().parents[1] / "vlhub"


def vlhub_imports(path: Path) -> set[str]:
    """The vlhub modules `path` imports (anywhere in the file, lazy imports included), as dotted names; the package
    itself is "vlhub"."""
    package = ["vlhub", *path.relative_to(VLHUB).parent.parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "vlhub")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module.split(".")[0] == "vlhub":
                # `from . import x` names a module x of that package (or a name of its __init__.py).
                found.update({module} if node.module else {f"{module}.{alias.name}" for alias in node.names})
    return found


def test_the_registry_imports_nothing_of_vlhub():
    assert vlhub_imports(VLHUB / "registry.py") == set()


@pytest.mark.parametrize("path", sorted((VLHUB / "training").glob("*.py")), ids=lambda p: p.name)
def test_training_imports_neither_the_architectures_nor_the_package_face(path):
    wrong = {m for m in vlhub_imports(path) if m == "vlhub" or m == "vlhub.modeling" or m.startswith("vlhub.modeling.")}
    assert not wrong, f"{path.name} imports {sorted(wrong)}"


def test_the_reader_sees_relative_and_lazy_imports():
    assert vlhub_imports(VLHUB / "modeling" / "auto.py") >= {"vlhub.modeling.discover_architectures", "vlhub.registry"}
    assert "vlhub.version" in vlhub_imports(VLHUB / "training" / "model_card.py")
    assert "vlhub.data.shapes" in vlhub_imports(VLHUB / "training" / "cli.py")  # inside a function


def test_the_shared_feature_file_readers_name_no_architecture():
    # Each architecture's own file formats are read in its folder and registered by it (register_feature_format);
    # the shared stores only know the registry.
    packages = [p.parent.name for p in (VLHUB / "modeling").glob("*/__init__.py")]
    assert len(packages) >= 5
    names = {
        variant for package in packages for variant in (package, package.replace("_", "-"), package.replace("_", " "))
    }
    for path in sorted((VLHUB / "processing" / "stores").glob("*.py")):
        text = path.read_text(encoding="utf-8").lower()
        named = sorted(name for name in names if name in text)
        assert not named, f"{path.name} names {named}"
