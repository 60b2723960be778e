"""The seams an architecture plugs into, proven with a throwaway architecture that is not UNITER.

Everything "toy_vl" needs is in this file: a config, a pre-training model, retrieval, multiple-choice and captioning
heads, a processor, two objectives, and ONE `register_architecture` call (its converter is two functions here too).
Then `pretrain.py --model_type toy_vl` trains it, `finetune.py --task retrieval|multiple_choice|captioning` fine-tunes
its heads, the retrieval (zero-shot and fine-tuned) and captioning pipelines run them, `vlhub convert toy_vl` converts
an "original" state dict, the Auto classes load them, and the shared lookups (objectives, default mix, heads,
declared capabilities) find it — with no edit anywhere in vlhub.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedConfig
from transformers.modeling_outputs import ModelOutput

import vlhub
from tests.training_helpers import reset_accelerate_state, tiny_pretraining_run
from vlhub.modeling.modeling_utils import VisionLanguagePreTrainedModel
from vlhub.processing.processor_base import RegionProcessor, VisionLanguageProcessor
from vlhub.registry import Architecture, MatchScore, register_architecture, unregister_architecture
from vlhub.training.masking import mask_tokens
from vlhub.training.objectives import Objective


class ToyVlConfig(PreTrainedConfig):
    model_type = "toy_vl"

    def __init__(
        self,
        vocab_size=30,
        hidden_size=16,
        region_feature_dim=12,
        num_region_labels=4,
        max_position_embeddings=64,
        **kwargs,
    ):
        self.vocab_size, self.hidden_size, self.max_position_embeddings = (
            vocab_size,
            hidden_size,
            max_position_embeddings,
        )
        self.num_hidden_layers = 1  # generate() sizes its (here unused) cache by it
        self.region_feature_dim, self.num_region_labels = region_feature_dim, num_region_labels
        super().__init__(**kwargs)


@dataclass
class ToyVlOutput(ModelOutput):
    loss: torch.FloatTensor | None = None
    mlm_loss: torch.FloatTensor | None = None
    caption_loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    itm_logits: torch.FloatTensor | None = None


class ToyVlPreTrainedModel(VisionLanguagePreTrainedModel):
    """Each word sees the mean of its image's regions (`encode`); the heads read those states."""

    config_class = ToyVlConfig
    _region_feature_layers = ("regions",)  # bounds the region features the pipelines accept

    def __init__(self, config):
        super().__init__(config)
        self.words = nn.Embedding(config.vocab_size, config.hidden_size)
        self.regions = nn.Linear(config.region_feature_dim, config.hidden_size)

    def encode(self, input_ids, region_features, region_attention_mask):
        mask = region_attention_mask.unsqueeze(-1).float()
        image = (self.regions(region_features) * mask).sum(1) / mask.sum(1)
        return torch.tanh(self.words(input_ids) + image.unsqueeze(1))


class ToyVlForPreTraining(ToyVlPreTrainedModel):
    """An MLM head predicts masked words; a matching head (`itm`, class 0 = match, the reverse of UNITER's order)
    scores the pair from the mean word state."""

    def __init__(self, config):
        super().__init__(config)
        self.mlm = nn.Linear(config.hidden_size, config.vocab_size)
        self.itm = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids, region_features, region_attention_mask, labels=None, **kwargs):
        states = self.encode(input_ids, region_features, region_attention_mask)
        logits = self.mlm(states)
        loss = None if labels is None else nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return ToyVlOutput(loss=loss, mlm_loss=loss, logits=logits, itm_logits=self.itm(states.mean(1)))


class ToyVlForImageTextRetrieval(ToyVlPreTrainedModel):
    """One score per pair (`rank`, started from the matching head's "match" row); trained on groups of a positive
    followed by `num_negatives` negatives with cross-entropy towards the positive."""

    def __init__(self, config):
        super().__init__(config)
        self.rank = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def initialize_from_pretraining(self, pretraining_state_dict):
        self.rank.weight.copy_(pretraining_state_dict["itm.weight"][0:1])
        self.rank.bias.copy_(pretraining_state_dict["itm.bias"][0:1])
        return ["rank.weight", "rank.bias"]

    def forward(self, input_ids, region_features, region_attention_mask, num_negatives=None, **kwargs):
        logits = self.rank(self.encode(input_ids, region_features, region_attention_mask).mean(1))
        loss = None
        if num_negatives is not None:
            groups = logits.view(-1, 1 + num_negatives)
            loss = nn.functional.cross_entropy(groups, torch.zeros(len(groups), dtype=torch.long))
        return ToyVlOutput(loss=loss, logits=logits)


class ToyVlForMultipleChoice(ToyVlPreTrainedModel):
    """Each (question, choice) text `(batch, choices, length)` with its question's regions `(batch, regions, ...)`."""

    def __init__(self, config):
        super().__init__(config)
        self.choice = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(self, input_ids, region_features, region_attention_mask, labels=None, **kwargs):
        batch, choices, length = input_ids.shape
        repeat = {"region_features": region_features, "region_attention_mask": region_attention_mask}
        repeat = {k: v.repeat_interleave(choices, 0) for k, v in repeat.items()}
        states = self.encode(input_ids.view(-1, length), **repeat)
        logits = self.choice(states.mean(1)).view(batch, choices)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return ToyVlOutput(loss=loss, logits=logits)


class ToyVlForConditionalGeneration(ToyVlPreTrainedModel, GenerationMixin):
    """Each position predicts the next word from its own word and the image (the pre-trained MLM head): a captioner
    whose logits never look back, so the cached decoding of `generate()` computes what a full forward does."""

    def __init__(self, config):
        super().__init__(config)
        self.mlm = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def forward(
        self,
        input_ids,
        region_features,
        region_attention_mask,
        region_locations=None,
        attention_mask=None,
        token_type_ids=None,
        labels=None,
        **kwargs,
    ):  # generate() passes what the forward names
        logits = self.mlm(self.encode(input_ids, region_features, region_attention_mask))
        loss = None if labels is None else nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return ToyVlOutput(loss=loss, caption_loss=loss, logits=logits)

    def generate(self, inputs=None, **kwargs):
        if inputs is None and kwargs.get("input_ids") is None:  # regions only: the captioning prompt, [CLS]
            batch = kwargs["region_features"].shape[0]
            kwargs["input_ids"] = torch.full((batch, 1), self.config.bos_token_id, dtype=torch.long)
        return super().generate(inputs, **kwargs)

    def check_generation_inputs(self, input_ids, max_new_tokens):
        if input_ids is not None and input_ids.shape[0] == 0:
            raise ValueError("empty batch: generate() needs at least one image")

    def caption_scoring_inputs(self, prompt, caption_ids, caption_mask=None):
        # Row t of the logits predicts caption word t from word t - 1 (the prompt's last token for the first word).
        return {**prompt, "input_ids": torch.cat([prompt["input_ids"][:, -1:], caption_ids[:, :-1]], 1)}


class ToyVlRegionProcessor(RegionProcessor):
    location_dim = 4

    def encode_locations(self, regions):
        height, width = regions.image_size
        return regions.boxes / torch.tensor([width, height, width, height])


class ToyVlProcessor(VisionLanguageProcessor):
    caption_prompt = False  # the copy `for_task("captioning")` gives lays out the captioning prompt

    def for_task(self, task):
        if task != "captioning":
            return self
        captioning = copy.copy(self)
        captioning.caption_prompt = True
        return captioning

    def __call__(self, text=None, regions=None, images=None, token_ids=None, return_tensors="pt", **kwargs):
        out = super().__call__(
            text=text, regions=regions, images=images, token_ids=token_ids, return_tensors=return_tensors, **kwargs
        )
        if self.caption_prompt and "input_ids" not in out:  # regions only: the captioning prompt, [CLS]
            prompt = torch.full((out["region_features"].shape[0], 1), self.tokenizer.cls_token_id, dtype=torch.long)
            out["input_ids"], out["attention_mask"] = prompt, torch.ones_like(prompt)
        return out

    def model_config_fields(self):  # generate() starts from [CLS] and stops at [SEP]
        tokenizer = self.tokenizer
        return {
            "bos_token_id": tokenizer.cls_token_id,
            "eos_token_id": tokenizer.sep_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        }


def _build_mlm(context, examples, rngs):
    inputs, _ = context.encode(examples)
    inputs["input_ids"], inputs["labels"] = mask_tokens(
        inputs["input_ids"],
        inputs["attention_mask"],
        context.tokenizer.all_special_ids,
        context.tokenizer.mask_token_id,
        context.random_token_ids,
        rngs,
        context.mlm_probability,
    )
    return inputs


def _build_caption(context, examples, rngs):
    """`[CLS] w [SEP]` with each position's label the next token (none after [SEP], none on padding)."""
    inputs, _ = context.encode(examples)
    labels = inputs["input_ids"].roll(-1, dims=1).masked_fill(inputs["attention_mask"].roll(-1, dims=1) == 0, -100)
    labels[:, -1] = -100
    inputs["labels"] = labels
    return inputs


TOY_OBJECTIVES = (Objective("mlm", None, _build_mlm), Objective("caption", None, _build_caption))


def add_arguments(parser):  # `vlhub convert toy_vl CHECKPOINT --output-dir DIR`
    parser.add_argument("checkpoint")
    parser.add_argument("--output-dir", required=True)


def convert_from_args(args):
    """The "original release" names its modules `emb.*`, `img.*`, `head.*` and keeps a training-only `aux.*`."""
    from vlhub.conversion.common import (
        ConversionReport,
        KeyMap,
        Provenance,
        convert_state_dict,
        load_torch_state_dict,
        save_converted,
    )

    source = load_torch_state_dict(args.checkpoint)
    vocab_size, hidden_size = source["emb.weight"].shape
    model = ToyVlForPreTraining(
        ToyVlConfig(vocab_size=vocab_size, hidden_size=hidden_size, region_feature_dim=source["img.weight"].shape[1])
    )
    report = ConversionReport(source="toy.pt")
    key_map = KeyMap(
        renames=[(r"^emb\.", "words."), (r"^img\.", "regions."), (r"^head\.", "mlm.")],
        drops={r"^aux\.": "training-only auxiliary head"},
    )
    convert_state_dict(source, model, key_map, report)
    save_converted(
        args.output_dir,
        model,
        report,
        provenance=Provenance(args.checkpoint, "https://example.org/toy", "0" * 40),
        title="Toy",
        architecture="toy_vl",
    )
    return report


TOY = Architecture(
    model_type="toy_vl",
    name="Toy-VL",
    package=__name__,
    config="ToyVlConfig",
    processor="ToyVlProcessor",
    region_processor="ToyVlRegionProcessor",
    task_models={
        "pretraining": "ToyVlForPreTraining",
        "retrieval": "ToyVlForImageTextRetrieval",
        "vcr": "ToyVlForMultipleChoice",
        "captioning": "ToyVlForConditionalGeneration",
    },
    objectives=f"{__name__}:TOY_OBJECTIVES",
    default_objectives={"mlm": 1},
    finetuning_objectives={"captioning": "caption"},
    config_presets={"tiny": {"hidden_size": 16}},
    lowercase=True,
    converter=__name__,
    match_score=MatchScore("itm_logits", match_class=0, log_odds=True),
    heads_from_pretraining={"retrieval"},
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
    assert set(objectives_for("toy_vl")) == {"mlm", "caption"} and default_objective_mix("toy_vl") == {"mlm": 1}
    assert toy_architecture.model_class("pretraining") is ToyVlForPreTraining
    with pytest.raises(ValueError, match="no 'vqa' head"):
        toy_architecture.model_class("vqa")
    with pytest.raises(ValueError, match="toy_vl"):  # the error lists the known model types
        vlhub.get_architecture("no_such_model")
    with pytest.raises(ValueError, match="already registered"):
        register_architecture(
            Architecture(
                model_type="toy_vl", name="other", package="x", config="C", processor="P", region_processor="R"
            )
        )


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
    regions = vlhub.RegionFeatures(
        features=torch.rand(3, 12), boxes=torch.tensor([[0.0, 0, 5, 5]] * 3), image_size=(10, 10)
    )
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
    original = {
        "emb.weight": torch.randn(30, 8),
        "img.weight": torch.randn(8, 12),
        "img.bias": torch.randn(8),
        "head.weight": torch.randn(30, 8),
        "head.bias": torch.randn(30),
        "aux.weight": torch.randn(2, 8),
    }
    torch.save(original, tmp_path / "toy.pt")
    assert main(["convert", "toy_vl", str(tmp_path / "toy.pt"), "--output-dir", str(tmp_path / "out")]) == 0
    model = AutoModelForPreTraining.from_pretrained(tmp_path / "out")
    assert type(model) is ToyVlForPreTraining
    assert torch.equal(model.words.weight, original["emb.weight"]) and torch.equal(
        model.mlm.bias, original["head.bias"]
    )
    report = (tmp_path / "out" / "conversion_report.json").read_text()
    assert "training-only auxiliary head" in report
    del original["aux.weight"]
    original["unknown.weight"] = torch.zeros(1)
    torch.save(original, tmp_path / "bad.pt")  # a key the map does not account for is refused, never dropped
    assert main(["convert", "toy_vl", str(tmp_path / "bad.pt"), "--output-dir", str(tmp_path / "bad")]) == 2


@pytest.fixture
def toy_pretrained(tmp_path, toy_architecture):
    """A toy model pre-trained by `pretrain.py` (tmp_path/run) on the synthetic region store (tmp_path/data)."""
    tiny_pretraining_run(tmp_path, "toy_vl")
    reset_accelerate_state()
    return tmp_path / "run"


def _finetune(tmp_path, task, dataset, *extra):
    from vlhub.training.cli import finetune_main

    result = finetune_main(
        [
            "--task",
            task,
            "--model_name_or_path",
            str(tmp_path / "run"),
            "--dataset",
            str(dataset),
            "--region_store",
            str(tmp_path / "data"),
            "--max_steps",
            "3",
            "--per_device_train_batch_size",
            "4",
            "--logging_steps",
            "1",
            "--learning_rate",
            "1e-2",
            "--output_dir",
            str(tmp_path / task),
            *extra,
        ]
    )
    reset_accelerate_state()
    assert [r["step"] for r in result.log_history if "loss" in r] == [1, 2, 3]
    return result


def _regions(seed):
    generator = torch.Generator().manual_seed(seed)
    return vlhub.RegionFeatures(
        features=torch.rand(3, 12, generator=generator),
        boxes=torch.tensor([[0.0, 0, 5, 5], [1, 1, 8, 9], [2, 0, 10, 10]]),
        image_size=(10, 10),
    )


def test_retrieval_zero_shot_and_fine_tuned_for_a_new_architecture(tmp_path, toy_pretrained):
    from transformers import pipeline

    # Zero-shot: the pre-training checkpoint ranks with its declared matching score (class 0 = match, as log-odds).
    ranker = pipeline("image-text-retrieval", model=str(toy_pretrained))
    regions, texts = _regions(0), ["a red circle", "two blue squares"]
    ranked = ranker(image=regions, texts=texts)
    with torch.no_grad():
        for r in ranked:
            itm = ranker.model(**ranker.processor(text=[r["text"]], regions=[regions])).itm_logits
            assert r["score"] == pytest.approx(itm.softmax(-1)[0, 0].item(), abs=1e-5)

    result = _finetune(
        tmp_path,
        "retrieval",
        tmp_path / "data" / "captions.jsonl",
        "--num_sampled_negatives",
        "3",
        "--num_hard_negatives",
        "1",
        "--max_gallery_images",
        "4",
    )
    assert all(0.0 <= result.eval_results[f"{way}_recall@1"] <= 1.0 for way in ("text_to_image", "image_to_text"))
    head = ToyVlForImageTextRetrieval.from_pretrained(tmp_path / "retrieval")
    pretrained = ToyVlForPreTraining.from_pretrained(toy_pretrained)
    assert not torch.equal(head.rank.weight, pretrained.itm.weight[0:1])  # started there (declared), then trained
    ranked = pipeline("image-text-retrieval", model=str(tmp_path / "retrieval"))(image=regions, texts=texts)
    with torch.no_grad():
        for r in ranked:
            logit = head(**ranker.processor(text=[r["text"]], regions=[regions])).logits
            assert r["logit"] == pytest.approx(logit.item(), abs=1e-5)


def test_the_retrieval_head_starts_from_the_declared_pre_trained_heads(tmp_path, toy_pretrained):
    from vlhub.training.cli import _load_task_model

    pretrained = ToyVlForPreTraining.from_pretrained(toy_pretrained)
    head = _load_task_model(ToyVlForImageTextRetrieval, str(toy_pretrained), pretrained.config, TOY)
    assert torch.equal(head.rank.weight, pretrained.itm.weight[0:1])
    assert torch.equal(head.words.weight, pretrained.words.weight)


def test_multiple_choice_fine_tunes_a_new_architecture(tmp_path, toy_pretrained):
    from transformers import AutoModelForMultipleChoice

    from tests.test_training_multiple_choice import write_choice_dataset

    write_choice_dataset(tmp_path / "mc")
    result = _finetune(tmp_path, "multiple_choice", tmp_path / "mc")
    assert set(result.eval_results) == {"validation_accuracy", "validation_loss", "validation_answer_prior_baseline"}
    assert type(AutoModelForMultipleChoice.from_pretrained(tmp_path / "multiple_choice")) is ToyVlForMultipleChoice


def test_captioning_fine_tunes_a_new_architecture_and_the_pipeline_captions(tmp_path, toy_pretrained):
    import datasets
    from transformers import pipeline

    from tests.training_helpers import synthetic_corpus
    from vlhub.training.captioning import check_can_caption

    corpus = synthetic_corpus()
    splits = {
        name: datasets.Dataset.from_dict({"image_id": [i for i, _ in pairs], "caption": [c for _, c in pairs]})
        for name, pairs in (("train", corpus.train), ("validation", corpus.validation))
    }
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "captions"))
    result = _finetune(
        tmp_path, "captioning", tmp_path / "captions", "--caption_metrics", "Bleu_1", "--max_caption_tokens", "4"
    )
    assert "validation_Bleu_1" in result.eval_results
    captioner = ToyVlForConditionalGeneration.from_pretrained(tmp_path / "captioning")
    check_can_caption(captioner, 4)  # the declared captioning head: self-critical training could drive it
    with pytest.raises(ValueError, match="ToyVlForMultipleChoice cannot be trained as a captioner"):
        check_can_caption(ToyVlForMultipleChoice(captioner.config))
    captions = pipeline("image-captioning", model=str(tmp_path / "captioning"))(
        [_regions(1), _regions(2)], generate_kwargs={"max_new_tokens": 4}
    )
    assert len(captions) == 2 and all(isinstance(c[0]["generated_text"], str) for c in captions)
    # The pipeline's caption is the model's greedy decoding.
    processor = vlhub_processor(tmp_path / "captioning")
    expected = captioner.generate(**processor(regions=[_regions(1)]), max_new_tokens=4, do_sample=False, num_beams=1)
    assert captions[0][0]["generated_text"] == processor.batch_decode(expected, skip_special_tokens=True)[0]


def vlhub_processor(folder):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(folder)
