"""Original ViLBERT checkpoints (jiasenlu/vilbert_beta, facebookresearch/vilbert-multi-task `.bin` files) → vlhub
folders.

vlhub's ViLBERT keeps the original module names (`bert.*` → `vilbert.*`, `cls.*`, `vil_prediction`, `vil_logit`,
`vision_logit`, ...), so the key map is nearly the identity. What is ViLBERT's own:

- three releases: the Conceptual Captions pre-trained model (`BertForMultiModalPreTraining`), the beta fine-tuned
  models (`VILBertForVLTasks`, weight-normed `vil_prediction.main.*`, `num_labels` read from the checkpoint) and the
  12-in-1 multi-task model (`logit_fc` heads for VQA / GQA / NLVR2, SNLI-VE, task-token embeddings);
- the weight norm of the beta answer head (`weight_norm(dim=None)`: W = g·v/‖v‖_F) folded into plain weights;
- keys dropped with a reason: the co-attention's `q_dense1`/`q_dense2` (defined, never used), the decoder tied to
  the word embeddings, the heads of the tasks not converted (a fine-tuned original computes every head on every
  forward; a vlhub head computes only its own);
- the zero-shot retrieval score of a pre-trained checkpoint (`softmax(alignment)[0]`) as `vil_logit`.
"""

import inspect
import logging
import os
import re
from pathlib import Path

import torch

from . import (
    ARCHITECTURE,
    VilbertConfig,
    VilbertForImageTextRetrieval,
    VilbertForMultipleChoice,
    VilbertForPreTraining,
    VilbertForQuestionAnswering,
    VilbertForReferringExpression,
    VilbertForVisualEntailment,
    VilbertForVisualReasoning,
    VilbertProcessor,
    VilbertRegionProcessor,
)
from ...conversion.common import CheckpointError, ConversionReport, KeyMap, OriginalConversion
from .modeling_vilbert import text_output_weights
from .reported_results import REPORTED_RESULTS
from ...conversion.reported import CardResults, size_release
from ...conversion.common import BERT_ATTENTION_HEADS, inferred_attention_heads
from ...conversion.common import OriginalRelease, layer_count

logger = logging.getLogger(__name__)

__all__ = [
    "convert_vilbert",
    "convert_from_args",
    "add_arguments",
    "detect_vilbert_release",
    "VILBERT_TASKS",
    "MULTI_TASK_IDS",
    "RELEASED_MULTI_TASK_IDS",
]

ORIGINAL_REPOSITORIES = {
    "pretrained": ("https://github.com/jiasenlu/vilbert_beta", "f0c9a2b21d4689e865f28c1eb1ee7e5f3f9387a7"),
    "beta": ("https://github.com/jiasenlu/vilbert_beta", "f0c9a2b21d4689e865f28c1eb1ee7e5f3f9387a7"),
    "multi_task": (
        "https://github.com/facebookresearch/vilbert-multi-task",
        "f22b84a9918a9aea2106e14ac1f6b32ad71492e3",
    ),
}
_RELEASES = {
    release: OriginalRelease(ARCHITECTURE, commit, REPORTED_RESULTS, logger, repository=repository)
    for release, (repository, commit) in ORIGINAL_REPOSITORIES.items()
}

VILBERT_TASKS = {
    "pretraining": VilbertForPreTraining,
    "vqa": VilbertForQuestionAnswering,
    "gqa": VilbertForQuestionAnswering,
    "retrieval": VilbertForImageTextRetrieval,
    "vcr": VilbertForMultipleChoice,
    "re": VilbertForReferringExpression,
    # 12-in-1 pointing among candidate boxes ("V-logit-mc"): the referring-expression head with choice_region_ids.
    "visual7w": VilbertForReferringExpression,
    "guesswhat_pointing": VilbertForReferringExpression,
    "flickr_grounding": VilbertForReferringExpression,  # 12-in-1 task 18, "V-logit" as RefCOCO
    "nlvr2": VilbertForVisualReasoning,
    "ve": VilbertForVisualEntailment,
}
# The original head keys each task reads (after `vil_prediction.main.` / `.logit_fc.` are normalised away).
_HEADS = {
    "pretraining": ("cls.",),
    "vqa": ("vil_prediction.",),
    "gqa": ("vil_prediction_gqa.",),
    "retrieval": ("vil_logit.",),
    "vcr": ("vil_logit.",),
    "re": ("vision_logit.",),
    "visual7w": ("vision_logit.",),
    "guesswhat_pointing": ("vision_logit.",),
    "flickr_grounding": ("vision_logit.",),
    "nlvr2": ("vil_binary_prediction.",),
    "ve": ("vil_tri_prediction.",),
}
# The 12-in-1 task number the processor of a converted multi-task model uses by default (vilbert_tasks.yml).
MULTI_TASK_IDS = {
    "vqa": 1,
    "gqa": 15,
    "retrieval": 8,
    "re": 10,
    "nlvr2": 12,
    "ve": 13,
    "vcr": 5,
    "pretraining": 1,
    "visual7w": 4,
    "guesswhat_pointing": 17,
    "flickr_grounding": 18,
}
# The tasks the released 12-in-1 model was trained on (its README: `--tasks 1-2-4-7-8-9-10-11-12-13-15-17`); the
# tokens of the others (VCR 5/6, GuessWhat 14, ...) were never trained in that release.
RELEASED_MULTI_TASK_IDS = (1, 2, 4, 7, 8, 9, 10, 11, 12, 13, 15, 17)
# Text lengths (`max_seq_length`, special tokens included) the originals trained each task with. 12-in-1: per task
# number (vilbert_tasks.yml); beta: per task (its task yml); pre-training: 36 in both.
MULTI_TASK_TEXT_LENGTHS = {
    1: 23,
    2: 26,
    3: 16,
    4: 20,
    5: 60,
    6: 80,
    7: 30,
    8: 30,
    9: 20,
    10: 20,
    11: 20,
    12: 40,
    13: 56,
    14: 25,
    15: 26,
    16: 20,
    17: 256,
    18: 24,
}
BETA_TEXT_LENGTHS = {"vqa": 16, "vcr": 60, "re": 20, "retrieval": 30}
PRETRAINING_TEXT_LENGTH = 36
# Region rows (`max_region_num`, the global token included) the originals' datasets keep, the first ones of the
# feature file: 101 for every 12-in-1 task but those named in MULTI_TASK_JOINED_ROWS, 100 for the beta release's
# four tasks (vlbert_tasks.yml). The converted processor's `max_regions` counts regions: `max_region_num - 1`.
# Pre-training read at most 36 regions (Conceptual Captions' 10-36; its loader fails beyond) and its checkpoint is
# fine-tuned on the tasks' 100 boxes: the converted pre-training processor keeps 100 regions, as the 12-in-1 tasks.
MULTI_TASK_REGION_ROWS = 101
BETA_REGION_ROWS = {"vqa": 100, "vcr": 100, "re": 100, "retrieval": 100}
# The grounding and pointing tasks join the ground-truth boxes (the "gt" feature file) after the detection rows and
# cut the joined rows to their own `max_region_num` (vilbert_tasks.yml; refer_expression_dataset.py and the
# others): converted as `max_joined_regions = max_region_num - 1`, the detections still `MULTI_TASK_REGION_ROWS - 1`.
# Pointing (Visual7w 4, GuessWhat 17) reads the candidates at row 101 + index: `ground_truth_rows="after_max_regions"`;
# RefCOCO (9-11) and Flickr grounding (18) score every row as concatenated: `"after_detections"`.
MULTI_TASK_JOINED_ROWS = {4: 200, 9: 101, 10: 101, 11: 101, 17: 306, 18: 200}
JOINED_TASKS = {
    "visual7w": "after_max_regions",
    "guesswhat_pointing": "after_max_regions",
    "re": "after_detections",
    "flickr_grounding": "after_detections",
}
_RENAMES = (
    (r"LayerNorm\.gamma", "LayerNorm.weight"),
    (r"LayerNorm\.beta", "LayerNorm.bias"),
    (r"^bert\.", "vilbert."),
    (r"^(vil_prediction|vil_prediction_gqa|vil_binary_prediction)\.(?:main|logit_fc)\.", r"\1."),
)
_KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD
_WEIGHT_NORM = re.compile(r"^(.*)\.weight_([gv])$")
# Sizes the released configs use, for a checkpoint converted without its config (text, visual, co-attention).
_DEFAULT_HEADS = {"hidden_size": BERT_ATTENTION_HEADS, "visual_hidden_size": {1024: 8}, "bi_hidden_size": {1024: 8}}


def detect_vilbert_release(state_dict: dict) -> str:
    """`"pretrained"`, `"beta"` (fine-tuned, weight-normed heads) or `"multi_task"` (12-in-1), from the keys
    (already renamed)."""
    if (
        any(k.startswith(("vil_prediction_gqa.", "vil_tri_prediction.")) for k in state_dict)
        or "vilbert.embeddings.task_embeddings.weight" in state_dict
    ):
        return "multi_task"
    if any(k.startswith(("vil_prediction.", "vil_logit.", "vision_logit.")) for k in state_dict):
        return "beta"
    return "pretrained"


def _config_from_checkpoint(conversion: OriginalConversion, notes: list[str]) -> tuple[VilbertConfig, int | None]:
    """The model config from the checkpoint's shapes and the original config (`conversion`'s); also the config's
    `num_labels`."""
    state_dict = conversion.state_dict
    shapes = {
        "v_feature_size": state_dict["vilbert.v_embeddings.image_embeddings.weight"].shape[1],
        "v_hidden_size": state_dict["vilbert.v_embeddings.image_embeddings.weight"].shape[0],
        "v_num_hidden_layers": layer_count(state_dict, "vilbert.encoder.v_layer."),
        "v_intermediate_size": state_dict["vilbert.encoder.v_layer.0.intermediate.dense.weight"].shape[0],
        "bi_hidden_size": state_dict["vilbert.t_pooler.dense.weight"].shape[0],
    }
    if "cls.imagePredictions.decoder.weight" in state_dict:
        shapes["v_target_size"] = state_dict["cls.imagePredictions.decoder.weight"].shape[0]
    location_dim = state_dict["vilbert.v_embeddings.image_location_embeddings.weight"].shape[1]
    if location_dim != 5:
        raise CheckpointError(f"the checkpoint's region locations are {location_dim}-d; ViLBERT's are 5-d")
    co_layers = layer_count(state_dict, "vilbert.encoder.c_layer.")
    # the heads of the three streams: below
    fields = conversion.bert_fields(conversion.original_config, "vilbert.", notes, None, sizes=shapes)
    if "v_biattention_id" not in fields or "t_biattention_id" not in fields:
        # Every released config puts the co-attention layers before the last text layers and the first visual ones.
        fields.setdefault("v_biattention_id", list(range(co_layers)))
        fields.setdefault(
            "t_biattention_id", list(range(fields["num_hidden_layers"] - co_layers, fields["num_hidden_layers"]))
        )
        notes.append(
            f"co-attention schedule not in the config: assumed v_biattention_id={fields['v_biattention_id']}, "
            f"t_biattention_id={fields['t_biattention_id']} (as every released config)"
        )
    elif len(fields["v_biattention_id"]) != co_layers:
        raise CheckpointError(
            f"the config lists {len(fields['v_biattention_id'])} co-attention layers but the checkpoint has {co_layers}"
        )
    for size_field, heads_field, original_heads in (
        ("hidden_size", "num_attention_heads", "num_attention_heads"),
        ("v_hidden_size", "v_num_attention_heads", "v_num_attention_heads"),
        ("bi_hidden_size", "bi_num_attention_heads", "bi_num_attention_heads"),
    ):
        if original_heads not in fields:
            fields[original_heads] = inferred_attention_heads(
                fields[size_field],
                notes,
                "the original config",
                heads_field,
                size_field,
                known=_DEFAULT_HEADS[size_field.replace("v_", "visual_")],
            )
    has_tokens = "vilbert.embeddings.task_embeddings.weight" in state_dict
    if "task_specific_tokens" in fields and bool(fields["task_specific_tokens"]) != has_tokens:
        raise CheckpointError(
            f"the config says task_specific_tokens={fields['task_specific_tokens']} but the checkpoint "
            f"{'has' if has_tokens else 'has no'} task-token embeddings"
        )
    fields.pop("task_specific_tokens", None)
    num_labels = fields.pop("num_labels", None)
    config = VilbertConfig.from_original_config(fields)
    if has_tokens:
        config.num_task_tokens = state_dict["vilbert.embeddings.task_embeddings.weight"].shape[0]
    return config, num_labels


def _key_map(task: str, release: str, config: VilbertConfig) -> KeyMap:
    drops = {r"\.biOutput\.q_dense[12]\.": "defined by the original BertBiOutput but never used in its forward"}
    if VILBERT_TASKS[task] is VilbertForReferringExpression:
        for pattern in text_output_weights(config):
            drops[pattern] = (
                "read only by the text stream's output (the text layers after the last co-attention layer, the text "
                "side of that layer, the poolers, linguisic_logit): the original computes it on every forward, but "
                f"the {task} head scores regions from the visual stream alone, so it does not have it"
            )
    if task != "pretraining":
        drops[r"^cls\."] = (
            f"pre-training heads: the original fine-tuned model computes them on every forward, but the {task} task "
            "never reads them, so the vlhub head does not have them (convert with --task pretraining to keep them)"
        )
    renames = list(_RENAMES)
    if task == "gqa":  # the GQA head becomes this model's `vil_prediction`; the VQA head is another task's
        renames.append((r"^vil_prediction\.", "vqa:vil_prediction."))
        renames.append((r"^vil_prediction_gqa\.", "vil_prediction."))
        drops[r"^vqa:vil_prediction\."] = "the VQA answer head (this folder is the GQA head)"
    own = _HEADS[task]
    others = sorted({p for prefixes in _HEADS.values() for p in prefixes if p not in own and p != "cls."})
    if task == "gqa":
        others = [p for p in others if p not in ("vil_prediction.", "vil_prediction_gqa.")]
    if others:
        drops["^(?:" + "|".join(re.escape(p) for p in others) + ")"] = (
            f"head of another task (the checkpoint is a {release} release; converting to {task!r})"
        )
    drops[r"^linguisic_logit\."] = "the original's per-token grounding score: no task's loss or output reads it"
    drops[r"\.weight_[gv]$"] = "weight norm (dim=None) folded into the plain weight: W = g * v / ||v||_F"
    return KeyMap(renames=renames, drops=drops)


def _fold_weight_norm(renamed: dict, report_notes: list[str]) -> dict:
    """`{target weight: (W, description)}` for every `weight_g`/`weight_v` pair (already renamed)."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in renamed.items():
        if m := _WEIGHT_NORM.match(key):
            pairs.setdefault(m.group(1), {})[m.group(2)] = value
    derived = {}
    for module, parts in pairs.items():
        if set(parts) != {"g", "v"}:
            raise CheckpointError(f"{module} has weight_{''.join(parts)} without its weight-norm partner")
        g, v = parts["g"], parts["v"]
        if g.numel() != 1:
            raise CheckpointError(
                f"{module}.weight_g has shape {tuple(g.shape)}; only weight_norm(dim=None) (a scalar "
                "g) is a released form"
            )
        derived[f"{module}.weight"] = (g * v / v.norm(), f"{module}.weight_g * weight_v / ||weight_v||")
    if derived:
        report_notes.append(f"weight norm folded into {sorted(derived)}")
    return derived


def _task_head_weights(
    renamed: dict, head_keys: set, task: str, release: str, checkpoint: Path, notes: list[str]
) -> dict:
    """The derived head weights the task needs (`vil_logit` from the alignment head for zero-shot retrieval), after
    checking that the checkpoint has the task's head: kept apart so that `convert_vilbert` reads as its steps."""
    if task == "retrieval" and "vil_logit.weight" not in head_keys:
        if "cls.bi_seq_relationship.weight" not in renamed:
            raise CheckpointError(f"{checkpoint.name} has neither vil_logit nor an alignment head for retrieval")
        weight, bias = VilbertForImageTextRetrieval.vil_logit_from_alignment(
            renamed["cls.bi_seq_relationship.weight"], renamed["cls.bi_seq_relationship.bias"]
        )
        notes.append(
            "vil_logit = alignment row 0 - row 1: sigmoid(vil_logit) is the original zero-shot score "
            "softmax(alignment)[0]"
        )
        return {
            "vil_logit.weight": (weight, "cls.bi_seq_relationship.weight[0] - [1]"),
            "vil_logit.bias": (bias, "cls.bi_seq_relationship.bias[0] - [1]"),
        }
    own = _HEADS[task]
    if not any(k.startswith(own) for k in renamed):
        raise CheckpointError(
            f"task {task!r} needs the head {', '.join(p + '*' for p in own)}, which "
            f"{checkpoint.name} (a {release} release) does not have"
        )
    return {}


def _converted_processor(model_config, task: str, release: str, task_id, tokenizer, notes) -> VilbertProcessor:
    """The processor with the original's task token, text length and region rule for `task`."""
    processor_task_id = None
    if model_config.num_task_tokens:
        processor_task_id = task_id if task_id is not None else MULTI_TASK_IDS[task]
        notes.append(f"multi-task model: the processor adds task id {processor_task_id} unless told otherwise")
        if processor_task_id not in RELEASED_MULTI_TASK_IDS:
            notes.append(
                f"task id {processor_task_id} is not one the released 12-in-1 model was trained on "
                f"({'-'.join(map(str, RELEASED_MULTI_TASK_IDS))}): its task token is untrained there (fine "
                "for a multi-task checkpoint of your own trained on it)"
            )
            logger.warning(notes[-1])
    max_text_length = _original_text_length(task, release, processor_task_id)
    notes.append(f"processor max_text_length {max_text_length}: the original's max_seq_length for this task")
    region_settings = _region_settings(task, release, processor_task_id, notes)
    tok = _RELEASES[release].load_tokenizer(tokenizer, model_config.vocab_size)
    region_processor = VilbertRegionProcessor(region_feature_dim=model_config.region_feature_dim, **region_settings)
    return VilbertProcessor(
        feature_extractor=region_processor,
        tokenizer=tok,
        num_task_tokens=model_config.num_task_tokens,
        task_id=processor_task_id,
        max_text_length=max_text_length,
    )


def _region_settings(task: str, release: str, task_id: int | None, notes: list[str]) -> dict:
    """The region processor's settings for the original's `max_region_num` of `task` (and its ground-truth join)."""
    region_rows = BETA_REGION_ROWS.get(task, MULTI_TASK_REGION_ROWS) if release == "beta" else MULTI_TASK_REGION_ROWS
    settings = {"max_regions": region_rows - 1, "region_selection": "first_n"}
    notes.append(
        f"processor max_regions {region_rows - 1} (the global token and the first {region_rows - 1} regions "
        "of each image, region_selection='first_n'): the original's max_region_num for this task, "
        f"{region_rows} rows"
    )
    if task in JOINED_TASKS:
        own_task_id = MULTI_TASK_IDS[task] if task_id is None else task_id
        joined_rows = region_rows if release == "beta" else MULTI_TASK_JOINED_ROWS.get(own_task_id, region_rows)
        settings.update(max_joined_regions=joined_rows - 1, ground_truth_rows=JOINED_TASKS[task])
        notes.append(
            f"processor max_joined_regions {joined_rows - 1}, ground_truth_rows {JOINED_TASKS[task]!r}: the "
            f"original joins the ground-truth boxes after the detections and keeps {joined_rows} rows"
        )
    elif task == "vcr":
        # vcr_dataset.py (both releases): max_region_num rows, the ground-truth boxes kept first.
        settings.update(max_joined_regions=region_rows - 1, ground_truth_rows="after_cut_detections")
        notes.append(
            f"processor max_joined_regions {region_rows - 1}, ground_truth_rows 'after_cut_detections': the original "
            "VCR datasets keep the ground-truth boxes first, the first detections fill the rest of "
            f"{region_rows} rows, after them, and the global token merges both files' global tokens"
        )
    return settings


def _original_text_length(task: str, release: str, task_id: int | None) -> int:
    """The text length the original trained `task` with: the 12-in-1 task number's, the beta task's, else
    pre-training's (a beta task the beta release had no config for, e.g. NLVR2, keeps pre-training's 36)."""
    if task == "pretraining":
        return PRETRAINING_TEXT_LENGTH
    if task_id is not None and task_id in MULTI_TASK_TEXT_LENGTHS:
        return MULTI_TASK_TEXT_LENGTHS[task_id]
    return BETA_TEXT_LENGTHS.get(task, PRETRAINING_TEXT_LENGTH)


class _VilbertConversion(OriginalConversion):
    """Convert an original ViLBERT checkpoint into a vlhub folder (safetensors, config, processor, model card).

    Args:
        checkpoint: the original `.bin` (`pytorch_model_9.bin`, `pytorch_model_19.bin`, `multi_task_model.bin`).
        output_dir: the folder to write.
        config: the original config json (`config/bert_base_6layer_6conect.json`), or a dict; it may add
            `num_labels` (checked against the checkpoint) and `task_specific_tokens`. Without it, sizes come from
            the checkpoint and the head counts of the released sizes are assumed.
        task: one of `VILBERT_TASKS`; default: `vqa` for a fine-tuned checkpoint, `pretraining` otherwise. A
            pre-trained checkpoint converted with `task="retrieval"` gets the original's zero-shot score.
        tokenizer: name, folder or vocab.txt of the uncased BERT tokenizer.
        answers: answer vocabulary for `vqa`/`gqa` (JSON list, or `{answer: index}`); without it the labels are
            placeholders (`answer_<i>`), noted in the report.
        task_id: multi-task checkpoints: the processor's default 12-in-1 task number (default: the task's own,
            `MULTI_TASK_IDS`).
    """

    release = _RELEASES["pretrained"]  # until `detect` knows the checkpoint's
    tasks = VILBERT_TASKS
    renames = _RENAMES
    required = ("vilbert.embeddings.word_embeddings.weight", "vilbert.v_embeddings.image_embeddings.weight")
    extra_parameters = (
        inspect.Parameter(
            "answers", _KEYWORD, default=None, annotation=str | os.PathLike | list[str] | dict[str, int] | None
        ),
        inspect.Parameter("task_id", _KEYWORD, default=None, annotation=int | None),
    )

    def detect(self) -> str:
        release = detect_vilbert_release(self.state_dict)
        self.release = _RELEASES[release]
        return release

    def default_task(self) -> str:
        return "vqa" if self.detected != "pretrained" else "pretraining"

    def model_config(self) -> tuple[VilbertConfig, list[str]]:
        notes: list[str] = []
        model_config, self.expected_labels = _config_from_checkpoint(self, notes)
        return model_config, notes

    def configure(self, model_config: VilbertConfig, report: ConversionReport) -> None:
        task, release, notes = self.task, self.detected, report.notes
        key_map = self.key_map(model_config)
        head_keys = {key_map.rename(k) for k in self.raw}
        self._derived = _task_head_weights(self.state_dict, head_keys, task, release, self.checkpoint, notes)
        if task in ("vqa", "gqa"):  # label2ans / ans2label: JSON, or the original's pickles (trainval_label2ans.pkl)
            final = self.state_dict.get(
                "vil_prediction.3.weight_v"
                if release == "beta"
                else ("vil_prediction_gqa.3.weight" if task == "gqa" else "vil_prediction.3.weight")
            )
            num_labels = final.shape[0]
            if self.expected_labels is not None and self.expected_labels != num_labels:
                raise CheckpointError(
                    f"the config says num_labels={self.expected_labels} but the checkpoint's answer head "
                    f"predicts {num_labels} answers"
                )
            note = f"no answer vocabulary given: id2label holds placeholders answer_0..answer_{num_labels - 1}"
            self.set_given_answer_labels(model_config, num_labels, notes, note)
        if release == "beta":
            model_config.classifier_type = "beta"
        if release == "beta" and task == "vqa":
            self._derived.update(_fold_weight_norm({key_map.rename(k): v for k, v in self.raw.items()}, notes))

    def derived(self, model, report: ConversionReport) -> dict:
        return self._derived

    def key_map(self, model_config: VilbertConfig) -> KeyMap:
        return _key_map(self.task, self.detected, model_config)

    def processor(self, model_config: VilbertConfig, report: ConversionReport) -> VilbertProcessor:
        task_id = self.options["task_id"]
        return _converted_processor(model_config, self.task, self.detected, task_id, self.tokenizer, report.notes)

    def save_settings(self, model, report: ConversionReport) -> dict:
        # the releases are all BERT-base; the pre-trained one is evaluated ranking without fine-tuning
        reported = CardResults(
            REPORTED_RESULTS,
            self.detected if size_release(model.config.hidden_size) == "base" else None,
            "zero_shot_retrieval" if (self.task, self.detected) == ("retrieval", "pretrained") else self.task,
        )
        return {"reported": reported, "title_suffix": f" ({self.detected} release)"}


convert_vilbert, add_arguments, convert_from_args = _VilbertConversion.public_functions(
    checkpoint_help="the original .bin file",
    config_help="the original config json (e.g. config/bert_base_6layer_6conect.json)",
    task_help="head to build (default: vqa for fine-tuned checkpoints, pretraining otherwise)",
    answers_help="answer vocabulary for vqa/gqa: label2ans list or ans2label dict (.json, or the original .pkl)",
    extra_arguments={
        "--task-id": dict(type=int, help="multi-task release: the processor's default 12-in-1 task number")
    },
)
