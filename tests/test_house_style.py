"""transformers' current house style in vlhub's modeling files: `@auto_docstring` documents every public model,
forward and output without complaint (it prints `[ERROR] ...` for an argument or field it cannot document)."""

import subprocess
import sys

import pytest

import vlhub

# The modeling files documented with `@auto_docstring` (issue 27): all five.
AUTO_DOCUMENTED = [
    "vlhub.modeling.vilbert.modeling_vilbert",
    "vlhub.modeling.uniter.modeling_uniter",
    "vlhub.modeling.unified_vlp.modeling_unified_vlp",
    "vlhub.modeling.vl_bert.modeling_vl_bert",
    "vlhub.modeling.tden.modeling_tden",
]


@pytest.mark.parametrize("module", AUTO_DOCUMENTED)
def test_auto_docstring_documents_every_argument_and_field(module):
    run = subprocess.run(
        [sys.executable, "-W", "always", "-c", f"import {module}"], capture_output=True, text=True, check=True
    )
    assert run.stdout == "" and "docstring" not in run.stderr and "Warning" not in run.stderr, run.stdout + run.stderr


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
