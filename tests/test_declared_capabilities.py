"""Shared code learns an architecture's special cases from its declaration (`vlhub.registry.Architecture`), never by
probing its objects: the declarations are checked when registered, each class against its protocol when resolved,
and a grep keeps probes out of shared code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from vlhub.registry import (
    Architecture,
    CaptionScorer,
    ChoiceLayout,
    InitializesFromPretraining,
    MatchScore,
    architectures,
)

ROOT = Path(__file__).resolve().parents[1]
SHARED = [
    "vlhub/training",
    "vlhub/pipelines",
    "vlhub/processing",
    "vlhub/cli.py",
    "vlhub/demo.py",
    "vlhub/conversion/common.py",
    "vlhub/modeling/auto.py",
    "vlhub/modeling/layers.py",
    "vlhub/registry.py",
]
QUIRKS = (
    r"vcr_text|alignment_logits|itm_logits|retrieval_negatives|caption_scoring_inputs|check_generation_inputs|"
    r"initialize_from_pretraining|mask_token_id"
)
# A quirk asked for by name, of anything.
QUIRK_PROBE = re.compile(r"\b(hasattr|getattr)\((?:[^()]|\([^()]*\))*?['\"](" + QUIRKS + r")['\"]")
# Any attribute asked of a model, processor, head, tokenizer, extractor or model output (or of their class); reading
# a model's config is not a probe of the model.
OBJECT_PROBE = re.compile(
    r"\b(hasattr|getattr)\(\s*(type\(\s*)?(self\.)?(model|processor|head|extractor|"
    r"tokenizer|captioner|outputs|feature_extractor)\b(?!\.config\b)"
)


def probes(text: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), 1) if QUIRK_PROBE.search(line) or OBJECT_PROBE.search(line)]


def test_the_probe_patterns_catch_probes_and_pass_declarations():
    caught = [
        'if hasattr(processor, "vcr_text"):',
        'kind = getattr(type(model), "retrieval_negatives", "sampled")',
        'if getattr(outputs, "alignment_logits", None) is not None:',
        'getattr(self.tokenizer, "x", 1)',
        'hasattr(model_class, "initialize_from_pretraining")',
        'getattr(model, "module", model)',
        'subfolder = getattr(processor.feature_extractor, "region_extractor_folder", None)',
    ]
    assert probes("\n".join(caught)) == list(range(1, len(caught) + 1))
    passed = [
        'if architecture.choice_layout == "vcr":',
        "getattr(importlib.import_module(module), name)",
        'getattr(self.model.config, "ranking_margin", None)',
        "model.initialize_from_pretraining(state)",
    ]
    assert probes("\n".join(passed)) == []


def test_shared_code_reads_declarations_instead_of_probing_objects():
    found = []
    for entry in SHARED:
        path = ROOT / entry
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            found += [f"{file.relative_to(ROOT)}:{n}" for n in probes(file.read_text())]
    assert not found, (
        f"shared code probes architecture objects (declare the capability on `Architecture` instead): {found}"
    )


@pytest.mark.parametrize("model_type", sorted(architectures()))
def test_every_architecture_implements_what_it_declares(model_type):
    architecture = architectures()[model_type]
    architecture.processor_class  # checked against ChoiceLayout where choice_layout="vcr"
    for task in architecture.task_models:
        model_class = architecture.model_class(task)  # checked against the task's protocol
        assert architecture.initializes_from_pretraining(model_class) == issubclass(
            model_class, InitializesFromPretraining
        ), f"{model_class.__name__}: heads_from_pretraining is not declared"
    if architecture.choice_layout == "vcr":
        assert issubclass(architecture.processor_class, ChoiceLayout)
    if architecture.has_task("captioning"):
        assert issubclass(architecture.model_class("captioning"), CaptionScorer)


def _toy(**declared) -> Architecture:
    return Architecture(
        model_type="toy_declared",
        name="Toy",
        package=__name__,
        config="ToyConfig",
        processor="ToyProcessor",
        region_processor="ToyProcessor",
        task_models={"pretraining": "ToyHead", "retrieval": "ToyHead", "captioning": "ToyHead"},
        **declared,
    )


class ToyProcessor:
    pass


class ToyHead:
    pass


@pytest.mark.parametrize(
    "declared, problem",
    [
        (dict(choice_layout="columns"), "choice_layout 'columns' is none of"),
        (dict(retrieval_negatives="all"), "retrieval_negatives 'all' is none of"),
        (
            dict(heads_from_pretraining={"vqa"}),
            r"heads_from_pretraining names tasks without a head in task_models: \['vqa'\]",
        ),
        (dict(match_score=("itm_logits", 1)), "match_score must be a MatchScore"),
    ],
)
def test_a_declaration_is_checked_when_made(declared, problem):
    with pytest.raises(ValueError, match=f"architecture 'toy_declared' .*{problem}"):
        _toy(**declared)
    with pytest.raises(ValueError, match="match_class must be 0 or 1"):
        MatchScore("itm_logits", match_class=2)


def test_a_class_that_lacks_a_declared_capability_is_named_when_resolved():
    architecture = _toy(choice_layout="vcr", heads_from_pretraining={"retrieval"})
    with pytest.raises(
        TypeError,
        match=r"'toy_declared' declares choice_layout=\"vcr\", but ToyProcessor does "
        r"not implement ChoiceLayout \(vcr_text\)",
    ):
        architecture.processor_class
    with pytest.raises(
        TypeError,
        match=r"'toy_declared' declares heads_from_pretraining=\{'retrieval'\}, but "
        r"ToyHead does not implement InitializesFromPretraining",
    ):
        architecture.model_class("retrieval")
    with pytest.raises(
        TypeError,
        match=r"a 'captioning' head, but ToyHead does not implement CaptionScorer "
        r"\(generate, caption_scoring_inputs, check_generation_inputs\)",
    ):
        architecture.model_class("captioning")


def test_match_scores_share_one_convention():
    """Higher is a better match, whichever column the architecture's head calls "match"."""
    logits = torch.tensor([[0.5, 2.0], [1.0, -1.0]])
    uniter_like = MatchScore("itm_logits", match_class=1)
    vilbert_like = MatchScore("alignment_logits", match_class=0, log_odds=True)
    assert torch.equal(uniter_like({"itm_logits": logits}), torch.tensor([2.0, -1.0]))
    assert torch.allclose(vilbert_like({"alignment_logits": logits}).sigmoid(), logits.softmax(-1)[:, 0])
    with pytest.raises(ValueError, match=r"'itm_logits' must be \(batch, 2\) matching logits, got None"):
        uniter_like({"logits": logits})


def test_auto_classes_follow_from_the_base_model_and_the_task_heads():
    """`AutoModel` takes `base_model`, a head takes its task's Auto class (`AUTO_CLASS_OF_TASK`), a task without one
    (retrieval) none, and an explicit `auto_models` entry wins."""
    assert dict(_toy(base_model="ToyModel").auto_models) == {
        "AutoModel": "ToyModel",
        "AutoModelForPreTraining": "ToyHead",
        "AutoModelForImageTextToText": "ToyHead",
    }
    overridden = _toy(auto_models={"AutoModelForPreTraining": "OtherHead"})
    assert dict(overridden.auto_models) == {
        "AutoModelForPreTraining": "OtherHead",
        "AutoModelForImageTextToText": "ToyHead",
    }


def test_a_folder_that_follows_the_naming_convention_declares_only_what_is_its_own():
    """`Architecture.from_folder`: the model type is the folder's name, the class, objective and converter names
    follow from it, and what a declaration gives replaces what the convention would."""
    conventional = Architecture.from_folder("vlhub.modeling.toy_vl", name="Toy", tasks=("pretraining", "vcr"))
    assert conventional == Architecture(
        model_type="toy_vl",
        name="Toy",
        package="vlhub.modeling.toy_vl",
        config="ToyVlConfig",
        processor="ToyVlProcessor",
        region_processor="ToyVlRegionProcessor",
        base_model="ToyVlModel",
        task_models={"pretraining": "ToyVlForPreTraining", "vcr": "ToyVlForMultipleChoice"},
        objectives="vlhub.modeling.toy_vl.objectives_toy_vl:TOY_VL_OBJECTIVES",
        converter="vlhub.modeling.toy_vl.convert_toy_vl",
    )
    own = Architecture.from_folder(
        "vlhub.modeling.toy_vl",
        name="Toy",
        tasks=("pretraining",),
        task_models={"pretraining": "ToyVlPretrainer", "matching": "ToyVlMatcher"},
        converter=None,
        lowercase=True,
    )
    assert dict(own.task_models) == {"pretraining": "ToyVlPretrainer", "matching": "ToyVlMatcher"}
    assert own.converter is None and own.lowercase and own.config == "ToyVlConfig"
    with pytest.raises(ValueError, match=r"'toy_vl' .*tasks \['matching'\] have no conventional head name"):
        Architecture.from_folder("vlhub.modeling.toy_vl", name="Toy", tasks=("pretraining", "matching"))


def test_the_registered_architectures_follow_the_naming_convention():
    """Each of vlhub's own architectures is declared with `from_folder`, so a sixth one can copy the shortest form."""
    for model_type, architecture in architectures().items():
        if not architecture.package.startswith("vlhub.modeling."):
            continue  # a test's throwaway architecture
        assert architecture.package == f"vlhub.modeling.{model_type}"
        assert architecture.converter == f"{architecture.package}.convert_{model_type}"
        assert architecture.base_model == architecture.config.removesuffix("Config") + "Model"
