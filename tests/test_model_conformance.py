"""What transformers' common tests expect of every exported model class, across the five architectures: a task head
starts from a base checkpoint, every parameter a head owns gets a gradient, `output_attentions` is visible to
transformers' introspection, and `_can_compile_fullgraph` is true where compile works."""

import importlib
import inspect

import pytest
import torch
from transformers import PreTrainedModel

from vlhub.registry import architectures

from .model_checks import ModelCase

CHECK_MODULES = {
    "uniter": "test_uniter_transformers_checks",
    "vl_bert": "test_vl_bert_transformers_checks",
    "vilbert": "test_vilbert_transformers_checks",
    "unified_vlp": "test_unified_vlp_transformers_checks",
    "tden": "test_tden_transformers_checks",
}
# Parameters a head still owns without a gradient, with the reason (each must still be true: see the test).
KNOWN_WITHOUT_GRADIENT: dict[str, str] = {}

# Classes that do not trace with `torch.compile(fullgraph=True)`, with the reason (each must still fail: see the test).
NOT_COMPILABLE = {
    "UniterForPreTraining": "MRFR and MRC return one row per masked region (a shape that depends on the data)"
}


def _cases(model_type: str) -> list[ModelCase]:
    return importlib.import_module(f"tests.{CHECK_MODULES[model_type]}").CASES


def _exported_models(model_type: str) -> list[type]:
    """Every `PreTrainedModel` the architecture exports, but its abstract base."""
    package = importlib.import_module(architectures()[model_type].package)
    found = (getattr(package, name) for name in package.__all__)
    return [
        cls
        for cls in found
        if isinstance(cls, type) and issubclass(cls, PreTrainedModel) and not cls.__name__.endswith("PreTrainedModel")
    ]


def _base_model_class(model_type: str) -> type:
    return getattr(
        importlib.import_module(architectures()[model_type].package),
        architectures()[model_type].auto_models["AutoModel"],
    )


ALL_MODELS = [(model_type, cls) for model_type in CHECK_MODULES for cls in _exported_models(model_type)]
MODEL_IDS = [cls.__name__ for _, cls in ALL_MODELS]


def test_every_architecture_is_covered():
    assert set(CHECK_MODULES) == set(architectures())


@pytest.mark.parametrize(("model_type", "model_class"), ALL_MODELS, ids=MODEL_IDS)
def test_every_parameter_gets_a_gradient_in_a_case_with_every_label(model_type, model_class):
    """transformers' "every parameter a head owns gets a gradient" (plain DDP needs it): each exported class has a
    case in its architecture's checks (tests/test_<arch>_transformers_checks.py, where `ModelChecks` runs the
    forward + backward) whose labels reach every parameter, with nothing exempted."""
    cases = [case for case in _cases(model_type) if case.model_class is model_class]
    assert cases, f"{model_class.__name__} has no case in tests/{CHECK_MODULES[model_type]}.py"
    complete = [case for case in cases if not case.unused_parameters]
    if model_class.__name__ in KNOWN_WITHOUT_GRADIENT:
        assert not complete, f"{model_class.__name__} now gives every parameter a gradient: drop its known exception"
        return
    assert complete, f"every case of {model_class.__name__} exempts parameters from getting a gradient"


@pytest.mark.parametrize("model_type", list(CHECK_MODULES))
def test_every_head_starts_from_a_base_checkpoint(model_type, tmp_path):
    """As every fine-tuning starts in transformers: a head loads a saved base model, its own new weights initialised
    and reported missing, every base weight loaded."""
    base_class = _base_model_class(model_type)
    config = next(case for case in _cases(model_type) if case.model_class is base_class).make_config()
    torch.manual_seed(0)
    base = base_class(config)
    base.save_pretrained(tmp_path)
    saved = base.state_dict()
    for head_class in _exported_models(model_type):
        if head_class is base_class:
            continue
        head, info = head_class.from_pretrained(tmp_path, output_loading_info=True)
        prefix = head_class.base_model_prefix + "."
        assert not info["unexpected_keys"], (head_class.__name__, info["unexpected_keys"])
        assert info["missing_keys"], f"{head_class.__name__}: a base checkpoint has none of the head's own weights"
        base_missing = [key for key in info["missing_keys"] if key.removeprefix(prefix) in saved]
        assert not base_missing, (head_class.__name__, base_missing)
        loaded = head.state_dict()
        for key, value in saved.items():
            if prefix + key in loaded:
                assert torch.equal(loaded[prefix + key], value), (head_class.__name__, key)


def _can_output_attentions(model_class) -> bool:
    """transformers' own introspection (`test_modeling_common.py`, `_can_output_attn`): an `output_attentions`
    parameter, or `**kwargs: Unpack[TransformersKwargs]` whose annotation can be read (a string annotation, as
    `from __future__ import annotations` makes, cannot)."""
    parameters = inspect.signature(model_class.forward).parameters
    if "output_attentions" in parameters:
        return True
    kwargs = parameters.get("kwargs")
    try:
        return "output_attentions" in kwargs.annotation.__args__[0].__annotations__
    except AttributeError:
        return False


@pytest.mark.parametrize(("model_type", "model_class"), ALL_MODELS, ids=MODEL_IDS)
def test_output_attentions_is_visible_to_transformers(model_type, model_class):
    assert _can_output_attentions(model_class), model_class.__name__


@pytest.mark.parametrize(("model_type", "model_class"), ALL_MODELS, ids=MODEL_IDS)
def test_can_compile_fullgraph_is_set(model_type, model_class):
    """True on every class but those that cannot, backed by `test_forward_compiles_without_graph_breaks` (slow)."""
    assert model_class._can_compile_fullgraph is (model_class.__name__ not in NOT_COMPILABLE)


# dynamo inlines and traces every layer call again, so the compile test builds one layer of each stack that repeats one
# layer module (ViLBERT: one text layer before and one in its single co-attention exchange): the same layer code is
# traced, and every class is still compiled and compared with its eager outputs.
ONE_LAYER_PER_STACK = {
    "uniter": {"num_hidden_layers": 1},
    "vl_bert": {"num_hidden_layers": 1},
    "vilbert": {
        "num_hidden_layers": 2,
        "visual_num_hidden_layers": 1,
        "visual_co_attention_layers": [0],
        "text_co_attention_layers": [1],
    },
    "unified_vlp": {"num_hidden_layers": 1},
    "tden": {"num_hidden_layers": 1, "num_visual_layers": 1, "num_cross_encoder_layers": 1, "num_decoder_layers": 1},
}


def _first_case(model_type: str, model_class) -> ModelCase:
    return next(case for case in _cases(model_type) if case.model_class is model_class)


@pytest.mark.slow  # dynamo traces each model (tens of seconds per class on a shared CPU)
@pytest.mark.parametrize(("model_type", "model_class"), ALL_MODELS, ids=MODEL_IDS)
def test_forward_compiles_without_graph_breaks(model_type, model_class):
    """`torch.compile(fullgraph=True)` (which fails on any graph break) gives the eager outputs. The eager backend
    traces with dynamo exactly as inductor would, without generating kernels."""
    case = _first_case(model_type, model_class)
    model = case.build(**ONE_LAYER_PER_STACK[model_type]).eval()
    inputs = case.inputs(model.config)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        expected = case.call(model, inputs)
        if model_class.__name__ in NOT_COMPILABLE:
            with pytest.raises(Exception):  # noqa: B017 (dynamo raises several types for an untraceable graph)
                case.call(compiled, inputs)
            return
        actual = case.call(compiled, inputs)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(actual[key], value, msg=f"{model_class.__name__}.{key}")
