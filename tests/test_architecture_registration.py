"""The seams an architecture plugs into, proven with a throwaway architecture that is not UNITER.

Everything "toy_vl" needs is in this file: a config, a pre-training model, a processor, one objective, and ONE
`register_architecture` call (its converter is two functions here too). Then `pretrain.py --model_type toy_vl`
trains it, `vlhub convert toy_vl` converts an "original" state dict, the Auto classes load both, and the shared
lookups (objectives, default mix, heads) find it — with no edit anywhere in vlhub.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import ModelOutput

import vlhub
from tests.training_helpers import reset_accelerate_state, tiny_pretraining_run
from vlhub.processing.processor_base import RegionProcessor, VisionLanguageProcessor
from vlhub.registry import Architecture, register_architecture, unregister_architecture
from vlhub.training.masking import mask_tokens
from vlhub.training.objectives import Objective


class ToyVlConfig(PreTrainedConfig):
    model_type = "toy_vl"

    def __init__(self, vocab_size=30, hidden_size=16, region_feature_dim=12, num_region_labels=4, **kwargs):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.region_feature_dim, self.num_region_labels = region_feature_dim, num_region_labels
        super().__init__(**kwargs)


@dataclass
class ToyVlOutput(ModelOutput):
    loss: torch.FloatTensor | None = None
    mlm_loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None


class ToyVlForPreTraining(PreTrainedModel):
    """Each word sees the mean of its image's regions; an MLM head predicts masked words."""

    config_class = ToyVlConfig

    def __init__(self, config):
        super().__init__(config)
        self.words = nn.Embedding(config.vocab_size, config.hidden_size)
        self.regions = nn.Linear(config.region_feature_dim, config.hidden_size)
        self.mlm = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def forward(self, input_ids, region_features, region_attention_mask, labels=None, **kwargs):
        mask = region_attention_mask.unsqueeze(-1).float()
        image = (self.regions(region_features) * mask).sum(1) / mask.sum(1)
        logits = self.mlm(torch.tanh(self.words(input_ids) + image.unsqueeze(1)))
        loss = None if labels is None else nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return ToyVlOutput(loss=loss, mlm_loss=loss, logits=logits)


class ToyVlRegionProcessor(RegionProcessor):
    location_dim = 4

    def encode_locations(self, regions):
        height, width = regions.image_size
        return regions.boxes / torch.tensor([width, height, width, height])


class ToyVlProcessor(VisionLanguageProcessor):
    pass


def _build_mlm(context, examples, rngs):
    inputs, _ = context.encode(examples)
    inputs["input_ids"], inputs["labels"] = mask_tokens(
        inputs["input_ids"], inputs["attention_mask"], context.tokenizer.all_special_ids,
        context.tokenizer.mask_token_id, context.random_token_ids, rngs, context.mlm_probability)
    return inputs


TOY_OBJECTIVES = (Objective("mlm", None, _build_mlm),)


def add_arguments(parser):  # `vlhub convert toy_vl CHECKPOINT --output-dir DIR`
    parser.add_argument("checkpoint")
    parser.add_argument("--output-dir", required=True)


def convert_from_args(args):
    """The "original release" names its modules `emb.*`, `img.*`, `head.*` and keeps a training-only `aux.*`."""
    from vlhub.conversion.common import (
        ConversionReport, KeyMap, Provenance, convert_state_dict, load_torch_state_dict, save_converted)

    source = load_torch_state_dict(args.checkpoint)
    vocab_size, hidden_size = source["emb.weight"].shape
    model = ToyVlForPreTraining(ToyVlConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                                            region_feature_dim=source["img.weight"].shape[1]))
    report = ConversionReport(source="toy.pt")
    key_map = KeyMap(renames=[(r"^emb\.", "words."), (r"^img\.", "regions."), (r"^head\.", "mlm.")],
                     drops={r"^aux\.": "training-only auxiliary head"})
    convert_state_dict(source, model, key_map, report)
    save_converted(args.output_dir, model, report, provenance=Provenance(args.checkpoint, "https://example.org/toy",
                                                                         "0" * 40), title="Toy", architecture="toy_vl")
    return report

TOY = Architecture(
    model_type="toy_vl", name="Toy-VL", package=__name__, config="ToyVlConfig", processor="ToyVlProcessor",
    region_processor="ToyVlRegionProcessor", auto_models={"AutoModelForPreTraining": "ToyVlForPreTraining"},
    task_models={"pretraining": "ToyVlForPreTraining"}, objectives=f"{__name__}:TOY_OBJECTIVES",
    default_objectives={"mlm": 1}, config_presets={"tiny": {"hidden_size": 16}}, lowercase=True, converter=__name__,
)


@pytest.fixture
def toy_architecture():
    register_architecture(TOY)
    yield TOY
    unregister_architecture("toy_vl")
    reset_accelerate_state()


def test_the_registry_answers_for_a_registered_architecture(toy_architecture):
    from vlhub.training import default_objective_mix, objectives_for

    assert vlhub.get_architecture("toy_vl") is toy_architecture
    assert set(objectives_for("toy_vl")) == {"mlm"} and default_objective_mix("toy_vl") == {"mlm": 1}
    assert toy_architecture.model_class("pretraining") is ToyVlForPreTraining
    with pytest.raises(ValueError, match="no 'vqa' head"):
        toy_architecture.model_class("vqa")
    with pytest.raises(ValueError, match="toy_vl"):  # the error lists the known model types
        vlhub.get_architecture("no_such_model")
    with pytest.raises(ValueError, match="already registered"):
        register_architecture(Architecture(model_type="toy_vl", name="other", package="x", config="C",
                                           processor="P", region_processor="R"))


def test_pretrain_py_trains_a_new_architecture_by_model_type_and_auto_classes_load_it(tmp_path, toy_architecture):
    from transformers import AutoConfig, AutoModelForPreTraining, AutoProcessor

    result = tiny_pretraining_run(tmp_path, "toy_vl")
    assert result.global_step == 3
    assert [r["step"] for r in result.log_history if "mlm_loss" in r] == [1, 2, 3]
    card = (tmp_path / "run" / "README.md").read_text()
    assert "Toy-VL pre-trained on" in card

    assert isinstance(AutoConfig.from_pretrained(tmp_path / "run"), ToyVlConfig)
    model = AutoModelForPreTraining.from_pretrained(tmp_path / "run")
    processor = AutoProcessor.from_pretrained(tmp_path / "run")
    assert type(model) is ToyVlForPreTraining and type(processor) is ToyVlProcessor
    assert processor.tokenizer.do_lower_case  # the architecture declared an uncased vocabulary
    regions = vlhub.RegionFeatures(features=torch.rand(3, 12), boxes=torch.tensor([[0.0, 0, 5, 5]] * 3),
                                   image_size=(10, 10))
    inputs = processor(text=["a red circle"], regions=[regions], return_tensors="pt")
    assert model(**inputs).logits.shape[:2] == inputs["input_ids"].shape


def test_an_unknown_model_type_lists_the_known_ones(tmp_path):
    from vlhub.training.cli import pretrain_main

    with pytest.raises(SystemExit, match="uniter"):
        pretrain_main(["--model_type", "no_such_model", "--output_dir", str(tmp_path / "run")])


def test_vlhub_convert_runs_a_new_architecture_converter_through_the_registry(tmp_path, toy_architecture):
    from transformers import AutoModelForPreTraining

    from vlhub.cli import main
    from vlhub.conversion import converters

    assert "toy_vl" in converters()
    original = {"emb.weight": torch.randn(30, 8), "img.weight": torch.randn(8, 12), "img.bias": torch.randn(8),
                "head.weight": torch.randn(30, 8), "head.bias": torch.randn(30), "aux.weight": torch.randn(2, 8)}
    torch.save(original, tmp_path / "toy.pt")
    assert main(["convert", "toy_vl", str(tmp_path / "toy.pt"), "--output-dir", str(tmp_path / "out")]) == 0
    model = AutoModelForPreTraining.from_pretrained(tmp_path / "out")
    assert type(model) is ToyVlForPreTraining
    assert torch.equal(model.words.weight, original["emb.weight"]) and torch.equal(model.mlm.bias, original["head.bias"])
    report = (tmp_path / "out" / "conversion_report.json").read_text()
    assert "training-only auxiliary head" in report
    del original["aux.weight"]
    original["unknown.weight"] = torch.zeros(1)
    torch.save(original, tmp_path / "bad.pt")  # a key the map does not account for is refused, never dropped
    assert main(["convert", "toy_vl", str(tmp_path / "bad.pt"), "--output-dir", str(tmp_path / "bad")]) == 2
