"""Original UNITER checkpoints (ChenRocks/UNITER `.pt` files) → vlhub folders.

The module tree of vlhub's UNITER keeps the original names (`uniter.embeddings.*`, `uniter.img_embeddings.*`,
`uniter.encoder.layer.N.*`, `cls.*`, `feat_regress.*`, `region_classifier.*`, `itm_output`, `vqa_output`, ...), so
the key map is almost the identity (the TF-era `gamma`/`beta` names, `bert.` → `uniter.`). What is UNITER's own:
which head keys belong to which task (and the parameters a head does not own, dropped with a reason), the tied MRFR
projection, the unused mask-embedding row, the zero-shot `rank_output`, table sizes read from the checkpoint (NLVR2,
VCR) and the VQA answer vocabulary. Key accounting, loading and saving are the generic core's (`common.py`).
"""

import logging
import re

import torch

from . import ARCHITECTURE, UniterConfig, UniterProcessor, UniterRegionProcessor
from ...conversion.common import CheckpointError, ConversionReport, KeyMap, OriginalConversion, OriginalRelease
from .reported_results import REPORTED_RESULTS

logger = logging.getLogger(__name__)

__all__ = [
    "convert_uniter",
    "convert_from_args",
    "add_arguments",
    "detect_uniter_task",
    "uniter_key_map",
    "UNITER_TASKS",
    "ORIGINAL_REPOSITORY",
    "ORIGINAL_COMMIT",
]

# The heads each task's class owns (by key prefix); every other head key belongs to another task.
_HEAD_PREFIXES = {
    "pretraining": ("cls.", "feat_regress.", "region_classifier.", "itm_output."),
    "vqa": ("vqa_output.",),
    "ve": ("vqa_output.",),
    "retrieval": ("rank_output.",),
    "nlvr2": ("nlvr2_output.", "attn1.", "attn2.", "fc.", "attn_pool."),
    "re": ("re_output.",),
    "vcr": ("vcr_output.",),
}
# The original loader's TF-era renames and its `bert.` → `uniter.` fallback for BERT-initialised files.
_RENAMES = ((r"LayerNorm\.gamma", "LayerNorm.weight"), (r"LayerNorm\.beta", "LayerNorm.bias"), (r"^bert\.", "uniter."))


# What a checkpoint of something else gives itself away by (for the error message).
_OTHER_CHECKPOINTS = {
    "ViLBERT": ("bert.v_embeddings", "bert.encoder.c_layer", "vil_prediction"),
    "VL-BERT": ("vlbert.", "module.vlbert", "object_linguistic_embeddings"),
    "Unified VLP": ("bert.vis_embed", "cls2.", "vis_pe"),
    "TDEN": ("encoder_layers", "visual_embed", "decoder"),
    "the bottom-up-attention detector": ("backbone.", "roi_heads.", "proposal_generator."),
    "BERT (text only)": ("bert.embeddings.word_embeddings.weight",),
}


def detect_uniter_task(state_dict: dict) -> str:
    """Which original class saved this state dict, from its head keys."""
    has = lambda prefix: any(k.startswith(prefix) for k in state_dict)  # noqa: E731
    if has("vcr_output."):
        return "vcr"
    if has("nlvr2_output."):
        return "nlvr2"
    if has("re_output."):
        return "re"
    if has("rank_output."):
        return "retrieval"
    if has("vqa_output."):
        return "ve" if state_dict["vqa_output.3.weight"].shape[0] == 3 else "vqa"
    if has("cls.predictions."):
        return "pretraining"
    return "pretraining"  # a bare backbone (e.g. the BERT-initialised `*-init.pt`)


def uniter_key_map(task: str, detected: str, nlvr2_head: str = "paired-attn") -> KeyMap:
    """The key map converting a `detected`-task checkpoint into the `task` head."""
    drops: dict[str, str] = {}
    if task != "pretraining":
        drops[r"^uniter\.img_embeddings\.mask_embedding\.weight$"] = (
            f"used only by pre-training (masked region modelling); the {task} head does not have it"
        )
    if task == "re" or (task == "nlvr2" and nlvr2_head == "paired-attn"):
        drops[r"^uniter\.pooler\."] = f"the {task} head does not use the pooled output (it has no pooler)"
    if task == "retrieval":
        drops[r"^itm_output\."] = (
            "seeds rank_output (zero-shot retrieval) when the checkpoint has none; the retrieval head does not keep it"
        )
    own = _HEAD_PREFIXES[task]
    others = sorted({p for prefixes in _HEAD_PREFIXES.values() for p in prefixes if p not in own})
    if others:
        drops["^(?:" + "|".join(re.escape(p) for p in others) + ")"] = (
            f"head of another task (the checkpoint is a {detected!r} model; converting to {task!r})"
        )
    ties = {"feat_regress.weight": "uniter.img_embeddings.img_linear.weight"} if task == "pretraining" else {}
    return KeyMap(renames=_RENAMES, drops=drops, ties=ties)


# The training config's region settings (`data/data.py`'s `DetectFeatLmdb`): every released config but the referring
# expression ones uses conf_th 0.2, min_bb 10, max_bb 100; those use conf_th -1 (a fixed count) with num_bb 100.
_REGION_KEYS = ("conf_th", "max_bb", "min_bb", "num_bb", "max_txt_len")
_DEFAULT_REGION_SETTINGS = {"conf_th": 0.2, "max_bb": 100, "min_bb": 10, "num_bb": 36}


def uniter_region_settings(original_config: dict | None, task: str) -> tuple[dict, str]:
    """`UniterRegionProcessor` settings reproducing the original's region rule, from a training config's `conf_th`,
    `min_bb`, `max_bb`, `num_bb` (or the released configs' values for `task`), and a note saying which.

    UNITER keeps the first `clamp(#(conf > conf_th), min_bb, max_bb)` rows of an image's entry, in the file's order
    ("count_by_confidence"). With `conf_th=-1` it keeps the first `num_bb` ("first_n")."""
    given = {k: original_config[k] for k in _REGION_KEYS if original_config and k in original_config}
    if "conf_th" not in given and task == "re":
        given = {"conf_th": -1, "num_bb": 100, **given}
    values = {**_DEFAULT_REGION_SETTINGS, **given}
    source = "the config's" if given else "the released configs'"
    if float(values["conf_th"]) == -1:
        count = int(values["num_bb"])
        return (
            {"confidence_threshold": None, "min_regions": 1, "max_regions": count, "region_selection": "first_n"},
            f"regions: the first {count} of each image (conf_th -1, num_bb {count}: {source} values)",
        )
    settings = {
        "confidence_threshold": float(values["conf_th"]),
        "min_regions": int(values["min_bb"]),
        "max_regions": int(values["max_bb"]),
        "region_selection": "count_by_confidence",
    }
    return settings, (
        f"regions: the first clamp(#(conf > {settings['confidence_threshold']}), {settings['min_regions']}, "
        f"{settings['max_regions']}) of each image, in the file's order ({source} conf_th, min_bb, "
        "max_bb)"
    )


def _zero_unused_mask_row(model, report: ConversionReport) -> None:
    """The original zeroes mask_embedding row 0 on every masked forward and never adds it otherwise."""
    mask_embedding = model.uniter.img_embeddings.mask_embedding.weight
    if mask_embedding[0].abs().max() > 0:
        with torch.no_grad():
            mask_embedding[0].zero_()
        report.notes.append(
            "mask_embedding row 0 zeroed: the original zeroes it on every masked forward and never adds it otherwise"
        )


def _zero_shot_rank_output(model_class, state_dict: dict, task: str, report: ConversionReport) -> dict:
    """`rank_output` from the ITM head's "match" row when a retrieval model is converted from a checkpoint without
    one (the original's zero-shot `inf_itm.py`); empty otherwise. Kept apart so that `convert_uniter` stays short."""
    if task != "retrieval" or "rank_output.weight" in state_dict or "itm_output.weight" not in state_dict:
        return {}
    weight, bias = model_class.rank_output_from_itm(state_dict["itm_output.weight"], state_dict["itm_output.bias"])
    report.notes.append("rank_output initialised from itm_output row 1 (the ITM 'match' logit): zero-shot retrieval")
    return {"rank_output.weight": (weight, "itm_output.weight[1]"), "rank_output.bias": (bias, "itm_output.bias[1]")}


class _UniterConversion(OriginalConversion):
    """Convert an original UNITER checkpoint into a vlhub folder (safetensors, config, processor, model card).

    Args:
        checkpoint: the original `.pt` (a flat state dict; fp16 or fp32).
        output_dir: the folder to write.
        config: the original config json (`config/uniter-base.json`); without it the sizes are read from the
            checkpoint and the head count inferred (12 for 768, 16 for 1024).
        task: one of `UNITER_TASKS`; default: detected from the head keys. A pre-training checkpoint converted with
            `task="retrieval"` gets the zero-shot `rank_output` (the ITM "match" row), as the original `inf_itm.py`.
        tokenizer: name, folder or vocab.txt of the cased BERT tokenizer for the processor.
        answers: VQA answer vocabulary (`ans2label.json`); default: looked for beside the checkpoint.
    """

    release = OriginalRelease(ARCHITECTURE, "1dbfa62bb8ddb1f2b11d20775ce324c5e45a3ab4", REPORTED_RESULTS, logger)
    renames = _RENAMES
    required = ("uniter.embeddings.word_embeddings.weight", "uniter.img_embeddings.img_linear.weight")
    other_checkpoints = _OTHER_CHECKPOINTS

    def detect(self) -> str:
        return detect_uniter_task(self.state_dict)

    def model_config(self) -> tuple[UniterConfig, list[str]]:
        original_config = self.original_config
        self.region_settings, region_note = uniter_region_settings(original_config, self.task)
        # max_txt_len counts word pieces ([CLS] and [SEP] come on top); the original drops longer training examples.
        self.max_text_length = int((original_config or {}).get("max_txt_len", 220 if self.task == "vcr" else 60)) + 2
        if original_config is not None:
            original_config = {k: v for k, v in original_config.items() if k not in _REGION_KEYS}
        notes: list[str] = []
        state_dict = self.state_dict
        region_sizes = {
            "region_feature_dim": state_dict["uniter.img_embeddings.img_linear.weight"].shape[1],
            "region_location_dim": state_dict["uniter.img_embeddings.pos_linear.weight"].shape[1],
        }
        # NLVR2 (3 types) and VCR (4 types, 29077 words) enlarge these tables after loading the config.
        enlarged = ("vocab_size", "type_vocab_size")
        fields = self.bert_fields(original_config, "uniter.", notes, "the original config", enlarged, region_sizes)
        model_config = UniterConfig.from_original_config(
            {k: v for k, v in fields.items() if k not in region_sizes},
            region_feature_dim=fields["region_feature_dim"],
            region_location_dim=fields["region_location_dim"],
        )
        notes.append(region_note)
        notes.append(
            f"processor max_text_length {self.max_text_length}: the original's max_txt_len word pieces + [CLS], [SEP]"
        )
        return model_config, notes

    def configure(self, model_config: UniterConfig, report: ConversionReport) -> None:
        """The head settings a task reads from the checkpoint: VQA's answer vocabulary (id2label), NLVR2's head
        kind, the referring-expression head's depth."""
        task, state_dict = self.task, self.state_dict
        if task in ("vqa", "ve"):
            if "vqa_output.3.weight" not in state_dict:
                raise CheckpointError(
                    f"task {task!r} needs a fine-tuned answer head (vqa_output.*); {self.checkpoint.name} has none"
                )
            if task == "vqa":
                how = "ans2label.json (train_vqa.py writes it beside its checkpoints)"
                self.set_answer_file_labels(
                    model_config, state_dict["vqa_output.3.weight"].shape[0], ("ans2label.json",), 2, how
                )
        if task == "nlvr2":
            model_config.nlvr2_head = "paired-attn" if "attn1.in_proj_weight" in state_dict else "paired"
        if task == "re" and "re_output.3.weight" in state_dict:
            model_config.re_head_layers = 2

    def derived(self, model, report: ConversionReport) -> dict:
        return _zero_shot_rank_output(type(model), self.state_dict, self.task, report)

    def key_map(self, model_config: UniterConfig) -> KeyMap:
        return uniter_key_map(self.task, self.detected, model_config.nlvr2_head)

    def finish(self, model, report: ConversionReport) -> None:
        if self.task == "pretraining":
            _zero_unused_mask_row(model, report)

    def processor(self, model_config: UniterConfig, report: ConversionReport) -> UniterProcessor:
        tok = self.release.load_tokenizer(self.tokenizer, model_config.vocab_size)
        return UniterProcessor(
            feature_extractor=UniterRegionProcessor(
                region_feature_dim=model_config.region_feature_dim, **self.region_settings
            ),
            tokenizer=tok,
            max_text_length=self.max_text_length,
        )

    def save_settings(self, model, report: ConversionReport) -> dict:
        # a pre-training checkpoint ranking without fine-tuning is reported as zero-shot retrieval
        zero_shot = (self.task, self.detected) == ("retrieval", "pretraining")
        return {"reported_task": "zero_shot_retrieval" if zero_shot else self.task}


convert_uniter, add_arguments, convert_from_args = _UniterConversion.public_functions(
    checkpoint_help="the original .pt file",
    config_help="the original config json (e.g. config/uniter-base.json)",
    answers_help="VQA answer vocabulary ans2label.json (default: looked for beside the checkpoint)",
)
ORIGINAL_REPOSITORY, ORIGINAL_COMMIT = _UniterConversion.release.original_repository, _UniterConversion.release.commit
UNITER_TASKS = _UniterConversion.tasks  # the task names the converter takes: the architecture's heads
