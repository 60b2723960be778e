"""transformers' current house style in vlhub's modeling files: `@auto_docstring` documents every public model,
forward and output without complaint (it prints `[ERROR] ...` for an argument or field it cannot document)."""

import pytest

import vlhub
from tests.fresh_interpreter import run_python_outputs

# The modeling files documented with `@auto_docstring` (issue 27): all five.
AUTO_DOCUMENTED = [
    "vlhub.modeling.vilbert.modeling_vilbert",
    "vlhub.modeling.uniter.modeling_uniter",
    "vlhub.modeling.unified_vlp.modeling_unified_vlp",
    "vlhub.modeling.vl_bert.modeling_vl_bert",
    "vlhub.modeling.tden.modeling_tden",
]


@pytest.fixture(scope="module")
def import_output() -> dict[str, tuple[str, str]]:
    """What importing each modeling file prints, `(stdout, stderr)` with warnings always shown, the five imported in
    turn by one fresh interpreter (forked from tests/fresh_interpreter.py's server); a message is attributed to the import that printed it."""
    marker = "@@ importing "
    code = (
        "import importlib, sys, warnings\n"
        "warnings.simplefilter('always')\n"  # as `python -W always`
        f"for module in {AUTO_DOCUMENTED!r}:\n"
        f"    print({marker!r} + module, flush=True)\n"
        f"    print({marker!r} + module, file=sys.stderr, flush=True)\n"
        "    importlib.import_module(module)\n"
        "    sys.stdout.flush(); sys.stderr.flush()\n"
    )
    sections = []
    for stream in run_python_outputs(code):
        assert stream.startswith(marker), stream  # nothing printed before the first import
        sections.append(dict(part.partition("\n")[::2] for part in stream.split(marker)[1:]))
    return {module: (sections[0][module], sections[1][module]) for module in AUTO_DOCUMENTED}


@pytest.mark.parametrize("module", AUTO_DOCUMENTED)
def test_auto_docstring_documents_every_argument_and_field(import_output, module):
    stdout, stderr = import_output[module]
    assert stdout == "" and "docstring" not in stderr and "Warning" not in stderr, stdout + stderr


@pytest.mark.parametrize("module", AUTO_DOCUMENTED)
def test_public_models_and_outputs_carry_their_documentation(module):
    import importlib

    modeling = importlib.import_module(module)
    for name in modeling.__all__:
        obj = getattr(modeling, name)
        model = isinstance(obj, type) and issubclass(obj, vlhub.modeling.modeling_utils.VisionLanguagePreTrainedModel)
        if model and not name.endswith("PreTrainedModel"):
            assert "This model inherits from [`PreTrainedModel`]" in obj.__doc__, name
            assert "Args:" in obj.forward.__doc__ and "region_features" in obj.forward.__doc__, name
        if isinstance(obj, type) and name.endswith("Output"):
            assert "of shape" in obj.__doc__, name


# Issue 27: short, plain functions. A longer one says more than one thing: split it where its parts have names.
MAX_FUNCTION_LINES = 80


def test_no_function_in_the_package_is_longer_than_the_limit():
    import ast
    from pathlib import Path

    package = Path(vlhub.__file__).parent
    longer = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # from `def` to the last line, decorators left out
                if lines > MAX_FUNCTION_LINES:
                    longer.append(f"{path.relative_to(package)}:{node.lineno} {node.name} ({lines} lines)")
    assert not longer, f"functions over {MAX_FUNCTION_LINES} lines: {longer}"
