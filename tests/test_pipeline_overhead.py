"""What a batch-1 pipeline call costs besides the model's forward: the region-feature magnitude bound is read from the
region layers' weights once per model and read again only when one of those parameters changes."""

import pytest
import torch
from transformers import pipeline

from vlhub.modeling import modeling_utils
from vlhub.modeling.modeling_utils import region_feature_limit

from .helpers import random_regions
from .test_pipelines import vqa_folder  # noqa: F401  (a fixture)


@pytest.fixture
def limit_computations(monkeypatch) -> list:
    """Each computation of the bound from the weights, as it happens."""
    computed = []
    compute = modeling_utils._region_feature_limit

    def counted(layers):
        computed.append(compute(layers))
        return computed[-1]

    monkeypatch.setattr(modeling_utils, "_region_feature_limit", counted)
    return computed


def test_the_pipeline_reads_the_region_weights_once(vqa_folder, limit_computations):  # noqa: F811
    vqa = pipeline("visual-question-answering", model=str(vqa_folder))
    regions = random_regions(4, 16, seed=1)
    first = vqa(image=regions, question="what is red ?")
    assert vqa(image=regions, question="what is red ?") == first
    vqa(image=[regions, random_regions(3, 16, seed=2)], question=["what is red ?", "is it blue ?"])
    assert len(limit_computations) == 1


def test_a_changed_region_weight_is_read_again(vqa_folder, limit_computations):  # noqa: F811
    model = pipeline("visual-question-answering", model=str(vqa_folder)).model
    layer = model.base_model.get_submodule(model.base_model._region_feature_layers[0])
    before = region_feature_limit(model)
    assert region_feature_limit(model) == before and len(limit_computations) == 1
    with torch.no_grad():
        layer.weight.mul_(2)  # in place (an optimizer step, load_state_dict)
    doubled = region_feature_limit(model)
    assert len(limit_computations) == 2 and doubled < before
    layer.weight = torch.nn.Parameter(layer.weight.detach() / 2)  # replaced
    assert region_feature_limit(model) == pytest.approx(before, rel=1e-12) and len(limit_computations) == 3
    model.half()  # the same parameters holding other data
    assert region_feature_limit(model) < before and len(limit_computations) == 4
    assert region_feature_limit(model) == limit_computations[-1] and len(limit_computations) == 4


def test_inference_mode_weights_are_never_remembered(vqa_folder, limit_computations):  # noqa: F811
    """Tensors made in `torch.inference_mode` count no in-place changes, so a bound read from them is not kept."""
    model = pipeline("visual-question-answering", model=str(vqa_folder)).model
    with torch.inference_mode():
        weight = torch.rand(model.config.hidden_size, model.config.region_feature_dim)
    layer = model.base_model.get_submodule(model.base_model._region_feature_layers[0])
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    region_feature_limit(model)
    region_feature_limit(model)
    assert len(limit_computations) == 2
