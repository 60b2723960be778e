"""`import vlhub` stays light, and registration with transformers works whatever is imported first."""

from __future__ import annotations

import pytest

from .fresh_interpreter import run_python

# Each order costs a fresh child (~2 s): the fast loop keeps vlhub first and transformers first; the two orders that
# start from a pipeline submodule run in the full suite.
ORDERS = [
    "import vlhub; from transformers import pipeline",
    "import transformers.pipelines; import vlhub",
    pytest.param("import vlhub.pipelines.visual_question_answering", marks=pytest.mark.slow),
    pytest.param("from vlhub.pipelines import VisualQuestionAnsweringPipeline", marks=pytest.mark.slow),
]


def _run(code: str) -> str:
    # A process that has imported nothing of vlhub or transformers yet (forked from a server that preloaded torch and third-party libraries).
    return run_python(code)


@pytest.mark.parametrize("first", ORDERS)
def test_pipelines_are_registered_whatever_is_imported_first(first):
    out = _run(
        f"{first}\nimport transformers.pipelines as t\n"
        "tasks = t.PIPELINE_REGISTRY.get_supported_tasks()\n"
        "print('visual-question-answering' in tasks, 'image-text-retrieval' in tasks)"
    )
    assert out.split() == ["True", "True"]


@pytest.fixture(scope="module")
def after_import_vlhub() -> list[str]:
    # One fresh child for both tests below: `import vlhub` alone first, then what each test imports next.
    out = _run(
        "import sys, vlhub\n"
        "print(sorted(m for m in ('datasets', 'pandas', 'pyarrow', 'torchvision') if m in sys.modules))\n"
        "heavy = ('transformers.modeling_utils', 'transformers.processing_utils', 'transformers.pipelines', "
        "'torchvision', 'vlhub.modeling.uniter.modeling_uniter')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "from transformers import AutoModel\n"
        "print(AutoModel.from_config(vlhub.UniterConfig(hidden_size=8, num_hidden_layers=1, "
        "num_attention_heads=2, intermediate_size=8)).__class__.__name__)\n"
        "from transformers.models.auto.processing_auto import PROCESSOR_MAPPING\n"
        "print(PROCESSOR_MAPPING[vlhub.UniterConfig].__name__)\n"
        # the converters (in the architecture folders) come only with `vlhub convert` or an explicit import
        "print(sorted(m for m in sys.modules if m.startswith('vlhub.conversion') or "
        "(m.startswith('vlhub.') and m.rpartition('.')[2].startswith('convert_'))))\n"
        "print('datasets' in sys.modules)\n"
        "from vlhub.processing.stores import RegionStore, open_feature_file, shards\n"
        "import vlhub.processing.stores as stores\n"
        "print(RegionStore.__module__, set(stores.__all__) == set(shards.__all__) | set(stores.original.__all__))\n"
        "print('datasets' in sys.modules)"
    )
    return out.split("\n")


def test_import_vlhub_loads_no_data_library_and_every_public_name_still_imports(after_import_vlhub):
    # datasets, pandas and pyarrow cost seconds (2,065 modules against transformers' and torch's 1,463): only the
    # region store and the training data need them, on first use (not with a model or a processor either).
    assert after_import_vlhub[0] == "[]"
    assert after_import_vlhub[5:8] == ["False", "vlhub.processing.stores.shards True", "True"]


def test_import_vlhub_leaves_models_processors_pipelines_and_torchvision_unimported(after_import_vlhub):
    assert after_import_vlhub[1:5] == ["[]", "UniterModel", "UniterProcessor", "[]"]
