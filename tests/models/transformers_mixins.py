"""transformers' own common model tests for vlhub's models: `ModelTesterMixin` and `ConfigTester` (with the input
helpers of test_modeling_common.py) from the `tests/` folder of the installed transformers version's source
distribution, which scripts/setup_env.sh downloads from the package index once and unpacks into the environment
(`<venv>/transformers_tests`, or $VLHUB_TRANSFORMERS_TESTS). Without it, a module importing this one is skipped.

The source distribution lacks three modules that test_modeling_common.py and test_configuration_common.py import;
they are provided here, never faked into passing:
- `generation/test_utils.py`: `GenerationTesterMixin` is an empty class no vlhub tester inherits, so transformers'
  generation tests do not run here (the captioners' testers skip `test_generation_tester_mixin_inheritance`, naming it).
- `exporters/test_export.py`: `ExportTesterMixin` (the `torch.export` tests `ModelTesterMixin` inherits) is empty.
- `utils/test_configuration_utils.py`: `config_common_kwargs`, a non-default value for every field of
  `PreTrainedConfig` (what `ConfigTester.check_config_arguments_init` checks a config passes on to it).
"""

import dataclasses
import importlib
import os
import sys
import types
from pathlib import Path

import pytest
import transformers

TRANSFORMERS_TESTS = Path(os.environ.get("VLHUB_TRANSFORMERS_TESTS", Path(sys.prefix) / "transformers_tests"))
PACKAGE = "transformers_tests"

# A non-default value for each field `PreTrainedConfig` itself declares (is_encoder_decoder and transformers_version
# are left out, as transformers' own list does: the first changes a model's structure, the second is set on save).
CONFIG_COMMON_KWARGS = {
    "architectures": ["BertModel"],
    "output_hidden_states": True,
    "return_dict": False,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "id2label": {0: "label"},
    "label2id": {"label": 0},
    "problem_type": "regression",
}
_NOT_CHECKED = {"is_encoder_decoder", "transformers_version"}


def _unpacked_version() -> str | None:
    marker = TRANSFORMERS_TESTS / "VERSION"
    return marker.read_text().strip() if marker.is_file() else None


def _add_module(name: str, **attributes) -> None:
    """Registers `transformers_tests.<name>` (and its parent packages) unless the source distribution has it."""
    parts = name.split(".")
    if (TRANSFORMERS_TESTS.joinpath(*parts[:-1]) / f"{parts[-1]}.py").is_file():
        return
    for depth in range(1, len(parts) + 1):
        module_name = ".".join([PACKAGE, *parts[:depth]])
        if module_name not in sys.modules:
            module = types.ModuleType(module_name)
            if depth < len(parts):
                module.__path__ = []
            sys.modules[module_name] = module
    module = sys.modules[f"{PACKAGE}.{name}"]
    for key, value in attributes.items():
        setattr(module, key, value)


def _load():
    version = _unpacked_version()
    if version != transformers.__version__:
        found = f"transformers {version}'s" if version else "no"
        pytest.skip(
            f"{found} test utilities at {TRANSFORMERS_TESTS} for the installed transformers {transformers.__version__}: "
            "run scripts/setup_env.sh (it unpacks the tests/ folder of transformers' source distribution there)",
            allow_module_level=True,
        )
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(TRANSFORMERS_TESTS)]
        sys.modules[PACKAGE] = package
    fields = {field.name for field in dataclasses.fields(transformers.PreTrainedConfig)}
    if fields - _NOT_CHECKED != set(CONFIG_COMMON_KWARGS):
        raise RuntimeError(f"PreTrainedConfig's fields changed ({sorted(fields)}): update CONFIG_COMMON_KWARGS")
    _add_module("generation.test_utils", GenerationTesterMixin=type("GenerationTesterMixin", (), {}))
    _add_module("exporters.test_export", ExportTesterMixin=type("ExportTesterMixin", (), {}))
    _add_module("utils.test_configuration_utils", config_common_kwargs=CONFIG_COMMON_KWARGS)
    return (
        importlib.import_module(f"{PACKAGE}.test_modeling_common"),
        importlib.import_module(f"{PACKAGE}.test_configuration_common"),
    )


# The Auto classes vlhub registers, by the name of transformers' mapping the mixin reads a class's role from
# (`get_values(MODEL_MAPPING_NAMES)`: a base model, trained without a loss; multiple choice; ...).
_AUTO_MAPPING_NAMES = {
    "AutoModel": "MODEL_MAPPING_NAMES",
    "AutoModelForPreTraining": "MODEL_FOR_PRETRAINING_MAPPING_NAMES",
    "AutoModelForMultipleChoice": "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES",
    "AutoModelForImageTextToText": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "AutoModelForVisualQuestionAnswering": "MODEL_FOR_VISUAL_QUESTION_ANSWERING_MAPPING_NAMES",
}


def _list_vlhub_auto_classes(modeling_common) -> None:
    """Lists vlhub's Auto registrations in the mixin module's copies of transformers' name mappings, as transformers
    lists its in-tree models there (transformers' own mappings are left as they are)."""
    import vlhub.modeling  # noqa: F401  (registers the architectures)
    from vlhub.registry import architectures

    for auto_class, mapping_name in _AUTO_MAPPING_NAMES.items():
        mapping = dict(getattr(transformers.models.auto.modeling_auto, mapping_name))
        for model_type, architecture in architectures().items():
            if auto_class in architecture.auto_models:
                mapping[model_type] = architecture.auto_models[auto_class]
        setattr(modeling_common, mapping_name, mapping)


_modeling_common, _configuration_common = _load()
_list_vlhub_auto_classes(_modeling_common)
ModelTesterMixin = _modeling_common.ModelTesterMixin
ConfigTester = _configuration_common.ConfigTester
floats_tensor = _modeling_common.floats_tensor
ids_tensor = _modeling_common.ids_tensor
random_attention_mask = _modeling_common.random_attention_mask

__all__ = ["ConfigTester", "ModelTesterMixin", "floats_tensor", "ids_tensor", "random_attention_mask"]
