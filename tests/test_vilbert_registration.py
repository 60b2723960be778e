"""Two architectures importing transformers' BERT: whatever the user imports first, both register with the Auto
classes (an architecture's registration must not import another's half-imported modules)."""

import pytest

from .fresh_interpreter import run_python

CHECK = """
{first}
from transformers import AutoModel, AutoProcessor
from transformers.models.auto.modeling_auto import MODEL_MAPPING
import vlhub
names = sorted(c.__name__ for c in MODEL_MAPPING._extra_content.values())
assert {{"UniterModel", "VilbertModel"}} <= set(names), names
print("ok")
"""


@pytest.mark.parametrize(
    "first",
    # Each order costs a fresh child (~2 s): the fast loop keeps BERT first and ViLBERT first; the full suite runs all.
    [
        "from transformers import BertModel",
        pytest.param("from vlhub import UniterModel", marks=pytest.mark.slow),
        "from vlhub import VilbertModel",
        pytest.param("from transformers import AutoModel", marks=pytest.mark.slow),
    ],
)
def test_every_import_order_registers_every_architecture(first):
    # A process that has imported nothing of vlhub or transformers yet (forked from a server that preloaded torch and third-party libraries).
    assert run_python(CHECK.format(first=first)).strip() == "ok"


def test_vilbert_is_declared_once():
    import vlhub
    from vlhub.registry import get_architecture

    architecture = get_architecture("vilbert")
    assert architecture.config_class is vlhub.VilbertConfig
    assert architecture.model_class("vqa") is vlhub.VilbertForQuestionAnswering
    assert set(architecture.task_models) == {"pretraining", "vqa", "retrieval", "nlvr2", "ve", "re", "vcr"}
