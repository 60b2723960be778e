"""Original VL-BERT checkpoints (jackroos/VL-BERT `.model` files) → vlhub folders.

The original saves `{"state_dict": net.state_dict(), "optimizer": ..., ...}` of a `DataParallel`-wrapped module, so
every key starts with `module.` (VCR adds `vlbert._module.` from its `TimeDistributed` wrapper). vlhub's VL-BERT keeps
BERT's names for what is BERT's and the original names for VL-BERT's own embeddings; the key map below moves the
top-level embeddings of the original (`object_linguistic_embeddings`, `aux_text_visual_embedding`, ...) into the
backbone and renames the task heads (`final_mlp` → `vqa_head` / `re_head` / `vcr_head`).

Both releases convert. "prec" (precomputed bottom-up-attention features, no CNN) and "e2e", whose model carries its
own Caffe-style ResNet-101 (`image_feature_extractor.backbone` = conv1 + layer1-3, `roi_head_feature_extractor` =
the dilated res5, saved a second time as `head.0`): its keys map onto vlhub's detector blocks (`stem.conv1`,
`res2..res4`, `res5`, each conv owning its frozen BatchNorm as `.norm`), the `head.0` copy is checked identical and
dropped, and the BatchNorm step counters are dropped. A checkpoint of another architecture is refused.
"""

import logging
import os
from pathlib import Path
from typing import Iterable

from ...utils.files import read_yaml
from . import (
    ARCHITECTURE,
    VlBertConfig,
    VlBertForMultipleChoice,
    VlBertForPreTraining,
    VlBertForQuestionAnswering,
    VlBertForReferringExpression,
    VlBertProcessor,
    VlBertRegionProcessor,
)
from ...conversion.common import (
    CheckpointError,
    ConversionReport,
    KeyMap,
    OriginalConversion,
    OriginalRelease,
    bert_sizes,
    inferred_attention_heads,
    layer_count,
)
from .reported_results import REPORTED_RESULTS

logger = logging.getLogger(__name__)

__all__ = [
    "convert_vl_bert",
    "convert_from_args",
    "add_arguments",
    "detect_vl_bert_task",
    "vl_bert_key_map",
    "VL_BERT_TASKS",
    "ORIGINAL_REPOSITORY",
    "ORIGINAL_COMMIT",
]

VL_BERT_TASKS = {
    "pretraining": VlBertForPreTraining,
    "vqa": VlBertForQuestionAnswering,
    "refcoco": VlBertForReferringExpression,
    "vcr": VlBertForMultipleChoice,
}

# VCR's TimeDistributed wrapper, taken off when the checkpoint is read (`module.` is stripped on loading).
_WRAPPER_RENAMES = ((r"^vlbert\._module\.", "vlbert."),)
# Original key → vlhub key, applied in order (after `module.` is stripped).
_RENAMES = (
    *_WRAPPER_RENAMES,
    (r"^vlbert\.embedding_LayerNorm\.", "vl_bert.embeddings.LayerNorm."),
    (
        r"^vlbert\.(word_embeddings|position_embeddings|token_type_embeddings|end_embedding|visual_ln_text|"
        r"visual_ln_object)\.",
        r"vl_bert.embeddings.\1.",
    ),
    (r"^vlbert\.mlm_head\.predictions\.", "cls.predictions."),
    (r"^vlbert\.mvrc_head\.region_cls_pred\.", "mvrc_head.decoder."),
    (r"^vlbert\.mvrc_head\.", "mvrc_head."),
    (r"^vlbert\.", "vl_bert."),  # encoder.*, pooler.*
    (
        r"^(object_linguistic_embeddings|object_mask_word_embedding|aux_text_visual_embedding)\.",
        r"vl_bert.embeddings.\1.",
    ),
    (r"^object_mask_visual_embedding\.weight$", "vl_bert.visual_embeddings.object_mask_visual_embedding"),
    (r"^image_feature_extractor\.obj_downsample\.", "vl_bert.visual_embeddings.obj_downsample."),
)
# Where each task's own head lives in the original (after the renames above) and in vlhub.
_HEAD_RENAMES = {
    "vqa": ((r"^final_mlp\.", "vqa_head."),),
    "refcoco": ((r"^final_mlp\.", "re_head."),),
    "vcr": ((r"^final_mlp\.", "vcr_head."), (r"^cnn_loss_reg\.", "vcr_region_head.")),
    "pretraining": (),
}
_PRETRAINING_ONLY = (
    r"^vl_bert\.embeddings\.(aux_text_visual_embedding|object_mask_word_embedding)\.",
    r"^vl_bert\.visual_embeddings\.object_mask_visual_embedding$",
)
# The e2e release's own CNN (Caffe-style ResNet-101 C1-C4 and the dilated res5 RoI head).
_E2E_PREFIXES = (
    "image_feature_extractor.backbone.",
    "image_feature_extractor.roi_head_feature_extractor.",
    "image_feature_extractor.head.",
)
_ENCODER = "vl_bert.visual_embeddings.image_encoder."
# The original's torchvision-style ResNet names → vlhub's detector blocks (detectron2 names, each conv owning its
# frozen BatchNorm as `.norm`). `head.0` is the same module as `roi_head_feature_extractor` (saved twice).
_E2E_RENAMES = (
    (r"^image_feature_extractor\.backbone\.conv1\.", _ENCODER + "backbone.stem.conv1."),
    (r"^image_feature_extractor\.backbone\.bn1\.", _ENCODER + "backbone.stem.conv1.norm."),
    (r"^image_feature_extractor\.backbone\.layer1\.", _ENCODER + "backbone.res2."),
    (r"^image_feature_extractor\.backbone\.layer2\.", _ENCODER + "backbone.res3."),
    (r"^image_feature_extractor\.backbone\.layer3\.", _ENCODER + "backbone.res4."),
    (r"^image_feature_extractor\.roi_head_feature_extractor\.", _ENCODER + "res5."),
    (r"^image_feature_extractor\.head\.0\.", _ENCODER + "head_copy_of_res5."),
    (r"^(vl_bert\.visual_embeddings\.image_encoder\..*)\.bn(\d)\.", r"\1.conv\2.norm."),
    (r"^(vl_bert\.visual_embeddings\.image_encoder\..*)\.downsample\.0\.", r"\1.shortcut."),
    (r"^(vl_bert\.visual_embeddings\.image_encoder\..*)\.downsample\.1\.", r"\1.shortcut.norm."),
)


def detect_vl_bert_task(state_dict: dict) -> str:
    """Which original module saved this state dict (keys without `module.`), from its heads."""
    if any(k.startswith("cnn_loss_reg.") for k in state_dict) or any(
        k.startswith("vlbert._module.") for k in state_dict
    ):
        return "vcr"
    if "final_mlp.2.weight" in state_dict:
        # VQA's answer head predicts many answers through BERT's transform (with LayerNorm); RefCOCO+'s one score.
        return "refcoco" if state_dict["final_mlp.2.weight"].shape[0] == 1 else "vqa"
    return "pretraining"


def vl_bert_key_map(task: str, detected: str, source_keys: Iterable[str] = ()) -> KeyMap:
    """The key map converting a `detected`-task checkpoint into the `task` head. With an e2e checkpoint's
    `source_keys`, its CNN keys are mapped too (and the duplicated `head.0.*` tied to the res5 they repeat)."""
    drops: dict[str, str] = {
        r"\.num_batches_tracked$": "BatchNorm step counter; the e2e CNN's BatchNorm is frozen (eval statistics only)"
    }
    e2e = any(k.startswith(_E2E_PREFIXES) for k in source_keys)
    ties = {}
    if e2e:
        renamer = KeyMap(renames=_E2E_RENAMES)
        for key in source_keys:
            target = renamer.rename(key)
            if ".head_copy_of_res5." in target:
                ties[target] = target.replace(".head_copy_of_res5.", ".res5.")
    if task != "pretraining":
        for pattern in _PRETRAINING_ONLY:
            drops[pattern] = (
                f"used only by pre-training (text-only rows, MVRC masking); the {task} head does not have it"
            )
        drops[r"^cls\.predictions\."] = f"MLM head of pre-training; the {task} head does not have it"
        drops[r"^mvrc_head\."] = f"MVRC head of pre-training; the {task} head does not have it"
    if task != "vcr":
        drops[r"^vl_bert\.pooler\."] = f"the {task} head reads no pooled output (the released model has no pooler)"
    if detected != task:
        drops[r"^(final_mlp|cnn_loss_reg)\."] = (
            f"head of another task (the checkpoint is a {detected!r} model; converting to {task!r})"
        )
    renames = [*_RENAMES, *(_E2E_RENAMES if e2e else ()), *(_HEAD_RENAMES[task] if detected == task else ())]
    return KeyMap(renames=renames, drops=drops, ties=ties)


# What a checkpoint of something else gives itself away by (for the error message).
_OTHER_CHECKPOINTS = {
    "UNITER": ("uniter.img_embeddings", "img_embeddings.img_linear"),
    "ViLBERT": ("bert.v_embeddings", "bert.encoder.c_layer", "vil_prediction"),
    "Unified VLP": ("bert.vis_embed", "cls2.", "vis_pe"),
    "the bottom-up-attention detector": ("roi_heads.", "proposal_generator."),
    "BERT (text only)": ("bert.embeddings.word_embeddings.weight",),
}


def _config(state_dict: dict, original_config, task: str) -> tuple[VlBertConfig, list[str]]:
    notes = []
    shapes = bert_sizes(state_dict, "vlbert.", "vlbert.encoder.layer.")
    hidden = shapes["hidden_size"]
    if original_config is not None:
        config = VlBertConfig.from_original_config(original_config)
        for name, value in shapes.items():
            if getattr(config, name) != value:
                raise CheckpointError(f"the config says {name}={getattr(config, name)} but the checkpoint has {value}")
    else:
        config = VlBertConfig(
            **shapes, num_attention_heads=inferred_attention_heads(hidden, notes, "the original YAML")
        )
    e2e = any(k.startswith(_E2E_PREFIXES) for k in state_dict)
    if original_config is not None and config.image_feature_precomputed == e2e:
        raise CheckpointError(
            f"the config says IMAGE_FEAT_PRECOMPUTED={config.image_feature_precomputed} but the checkpoint is "
            + ("an end-to-end (e2e) one with its own ResNet" if e2e else "a 'prec' one without a CNN")
        )
    if e2e:
        _configure_e2e(config, state_dict)
    projection = state_dict["image_feature_extractor.obj_downsample.1.weight"]
    if projection.shape[1] != config.region_input_dim:
        raise CheckpointError(
            f"the visual feature projection takes {projection.shape[1]} inputs, expected geometry "
            f"{8 * config.geometry_embedding_dim} + appearance {config.region_feature_dim} = {config.region_input_dim}"
        )
    if "vlbert.mvrc_head.region_cls_pred.weight" in state_dict:
        config.num_region_labels = state_dict["vlbert.mvrc_head.region_cls_pred.weight"].shape[0]
    if task == "vcr":
        config.with_pooler = True
        config.num_vcr_region_labels = (
            state_dict["cnn_loss_reg.2.weight"].shape[0] if "cnn_loss_reg.2.weight" in state_dict else 0
        )
    return config, notes


def _image_scales(original_config, task: str) -> tuple[int, int]:
    """`(min_size, max_size)` the original resizes images to: the YAML's `SCALES` (VQA / RefCOCO+ / pre-training
    600-1000, VCR 600-1200); without a YAML, VCR's or the others' default."""
    if original_config is not None:
        if isinstance(original_config, dict):
            original = original_config
        else:
            original = read_yaml(original_config, "the original VL-BERT config")
        scales = original.get("SCALES")
        if scales is not None:
            if not (
                isinstance(scales, (list, tuple))
                and len(scales) == 2
                and all(isinstance(v, int) for v in scales)
                and 1 <= scales[0] <= scales[1]
            ):
                raise CheckpointError(f"the config's SCALES must be [short side, longest side], got {scales!r}")
            return scales[0], scales[1]
    return 600, 1200 if task == "vcr" else 1000


def conceptual_captions_seq_len(original_config: dict | str | os.PathLike | None, task: str) -> int | None:
    """The pre-training YAML's Conceptual Captions `SEQ_LEN` (the dataset's default 64 when the entry has none), or
    None when `task` is not pre-training or the YAML has no such dataset (then no joint text/object limit)."""
    if task != "pretraining" or original_config is None:
        return None
    original = (
        original_config
        if isinstance(original_config, dict)
        else read_yaml(original_config, "the original VL-BERT config")
    )
    datasets = original.get("DATASET")
    for entry in datasets if isinstance(datasets, list) else [datasets]:
        if isinstance(entry, dict) and entry.get("DATASET") == "conceptual_captions":
            seq_len = entry.get("SEQ_LEN", 64)
            if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 4:
                raise CheckpointError(
                    f"the config's conceptual_captions SEQ_LEN must be an integer >= 4, got {seq_len!r}"
                )
            return seq_len
    return None


def _configure_e2e(config: VlBertConfig, state_dict: dict) -> None:
    """The e2e CNN's size from its keys: blocks per stage (ResNet-50/101/152) and widths."""
    prefix = "image_feature_extractor.backbone."
    if (
        f"{prefix}conv1.weight" not in state_dict
        or "image_feature_extractor.roi_head_feature_extractor.0.conv1.weight" not in state_dict
    ):
        raise CheckpointError(
            "an e2e VL-BERT checkpoint needs image_feature_extractor.backbone.* and "
            "image_feature_extractor.roi_head_feature_extractor.* (the ResNet and its res5)"
        )
    blocks = tuple(layer_count(state_dict, f"{prefix}layer{stage}.") for stage in (1, 2, 3))
    depths = {(3, 4, 6): 50, (3, 4, 23): 101, (3, 8, 36): 152}
    if blocks not in depths:
        raise CheckpointError(f"the e2e ResNet has {blocks} blocks in layer1..3, not ResNet-50/101/152")
    config.backbone_depth = depths[blocks]
    config.backbone_stem_channels = state_dict[f"{prefix}conv1.weight"].shape[0]
    config.backbone_width_per_group = state_dict[f"{prefix}layer1.0.conv1.weight"].shape[0]
    config.backbone_res2_channels = state_dict[f"{prefix}layer1.0.conv3.weight"].shape[0]
    config.region_feature_dim = 8 * config.backbone_res2_channels
    config.image_feature_precomputed = False


def _converted_processor(model_config, tok, config, task: str, report: ConversionReport) -> VlBertProcessor:
    """The processor with the original loaders' rules: every box kept, pre-training's sort and joint cut."""
    # Pre-training on Conceptual Captions: boxes by largest class score, text and objects cut together to SEQ_LEN.
    seq_len = conceptual_captions_seq_len(config, task)
    if seq_len is not None:
        report.notes.append(
            f"processor: objects sorted by their largest class score and text + objects (the whole "
            f"image included) cut together to {seq_len}, as the original's Conceptual Captions loader "
            "(SEQ_LEN); fine-tuning (for_task) turns this off"
        )
    return VlBertProcessor(
        # The original's datasets keep every box of a feature file (and the whole-image box first): no limit.
        feature_extractor=VlBertRegionProcessor(
            region_feature_dim=model_config.region_feature_dim,
            max_regions=None,
            image_feature_precomputed=model_config.image_feature_precomputed,
            sort_by_class_score=seq_len is not None,
            **dict(zip(("min_size", "max_size"), _image_scales(config, task))),
        ),
        tokenizer=tok,
        answer_slot=task == "vqa",
        max_text_and_objects=seq_len,
    )


class _VlBertConversion(OriginalConversion):
    """Convert an original VL-BERT "prec" checkpoint into a vlhub folder (safetensors, config, processor, card).

    Args:
        checkpoint: the original `.model` file (`{"state_dict": ...}`; fp16 tensors are cast to fp32).
        output_dir: the folder to write.
        config: the original YAML (`cfgs/<task>/*.yaml`); without it the sizes are read from the checkpoint and the
            head count inferred (12 for 768, 16 for 1024).
        task: one of `VL_BERT_TASKS`; default: detected from the head keys. A pre-training checkpoint converted to
            `vqa` / `refcoco` starts the head's transform from the MLM / MVRC transform, as the original fine-tuning
            does (`PARTIAL_PRETRAIN_PREFIX_CHANGES`); the rest of the head is newly initialised.
        tokenizer: name, folder or vocab.txt of the uncased BERT tokenizer for the processor.
        answers: VQA answer vocabulary (`answers_vqa.txt`, one answer per line); default: looked for beside the
            checkpoint.
    """

    release = OriginalRelease(ARCHITECTURE, "4373674cbf2bcd6c09a2c26abfdb6705b870e3be", REPORTED_RESULTS, logger)
    tasks = VL_BERT_TASKS
    renames = _WRAPPER_RENAMES
    required = ("vlbert.word_embeddings.weight",)
    other_checkpoints = _OTHER_CHECKPOINTS

    def detect(self) -> str:
        return detect_vl_bert_task(self.raw)

    def check(self) -> None:
        if self.detected not in ("pretraining", self.task):
            raise CheckpointError(
                f"{self.checkpoint.name} is a fine-tuned {self.detected!r} model; it cannot become a {self.task!r} "
                "model (only a pre-training checkpoint starts every task)"
            )

    def read_config(self) -> dict | Path | None:
        """The original YAML as a path (read where its fields are needed), or the dict given."""
        return self.config if self.config is None or isinstance(self.config, dict) else Path(self.config)

    def model_config(self) -> tuple[VlBertConfig, list[str]]:
        return _config(self.state_dict, self.original_config, self.task)

    def configure(self, model_config: VlBertConfig, report: ConversionReport) -> None:
        if self.task == "vqa":  # a fine-tuned head fixes the answer count
            num_answers = self.state_dict["final_mlp.2.weight"].shape[0] if self.detected == "vqa" else None
            how = "answers_vqa.txt (the original's DATASET.ANSWER_VOCAB_FILE)"
            self.set_answer_file_labels(model_config, num_answers, ("answers_vqa.txt",), 1, how)

    def derived(self, model, report: ConversionReport) -> dict:
        if self.detected != "pretraining" or self.task not in ("vqa", "refcoco"):
            return {}
        source, target = (
            ("vlbert.mlm_head.predictions.transform.", "vqa_head.0.")
            if self.task == "vqa"
            else ("vlbert.mvrc_head.transform.", "re_head.0.")
        )
        report.notes.append(f"{target}* initialised from {source}* (the original fine-tuning's partial pre-training)")
        return {target + k[len(source) :]: (v, k) for k, v in self.state_dict.items() if k.startswith(source)}

    def source_weights(self) -> dict:
        return self.state_dict  # the report names the keys without VCR's TimeDistributed wrapper

    def key_map(self, model_config: VlBertConfig) -> KeyMap:
        return vl_bert_key_map(self.task, self.detected, self.state_dict.keys())

    def finish(self, model, report: ConversionReport) -> None:
        if self.task == "vcr" and "vl_bert.pooler.dense.weight" in report.initialized:
            report.notes.append("the pooler is not in the checkpoint; the original VCR model takes it from BERT")

    def processor(self, model_config: VlBertConfig, report: ConversionReport) -> VlBertProcessor:
        tok = self.release.load_tokenizer(self.tokenizer, model_config.vocab_size)
        if tok.mask_token_id != model_config.mask_token_id:
            model_config.mask_token_id = tok.mask_token_id
        return _converted_processor(model_config, tok, self.config, self.task, report)


convert_vl_bert, add_arguments, convert_from_args = _VlBertConversion.public_functions(
    checkpoint_help="the original .model file (vl-bert-base-prec.model, a fine-tuned one, ...)",
    config_help="the original YAML (cfgs/<task>/*.yaml)",
    answers_help="VQA answer vocabulary answers_vqa.txt (default: beside the checkpoint)",
)
ORIGINAL_REPOSITORY, ORIGINAL_COMMIT = _VlBertConversion.release.original_repository, _VlBertConversion.release.commit
