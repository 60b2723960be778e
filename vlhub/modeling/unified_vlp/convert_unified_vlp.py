"""Original Unified VLP checkpoints (LuoweiZhou/VLP `model.{epoch}.bin`) → vlhub folders.

The released files are flat state dicts of `BertForPreTrainingLossMask` (no `module.` prefix): `bert.*` (BERT-base
with six token types), `cls.predictions.*` (the MLM head; `cls.predictions.decoder.weight` is a saved copy of the
word embeddings), the top-level region projections `vis_embed.*` / `vis_pe_embed.*`, and for VQA `ans_classifier.*`.
vlhub keeps BERT's names under `vlp.` and moves the region projections into the embeddings
(`vlp.embeddings.vis_embed.*`, `vlp.embeddings.vis_pe_embed.*`). Key accounting, loading and saving are the generic
core's (`common.py`).
"""

import logging
from pathlib import Path

from . import ARCHITECTURE
from ...conversion.common import CheckpointError, ConversionReport, KeyMap, OriginalConversion, OriginalRelease
from .reported_results import REPORTED_RESULTS

logger = logging.getLogger(__name__)

__all__ = [
    "convert_unified_vlp",
    "convert_from_args",
    "add_arguments",
    "unified_vlp_key_map",
    "VLP_TASKS",
    "ORIGINAL_REPOSITORY",
    "ORIGINAL_COMMIT",
]

# task → head class name: the architecture's declaration.
VLP_TASKS = dict(ARCHITECTURE.task_models)
_RENAMES = (
    (r"LayerNorm\.gamma$", "LayerNorm.weight"),
    (r"LayerNorm\.beta$", "LayerNorm.bias"),
    (r"^bert\.", "vlp."),
    (r"^vis_embed\.", "vlp.embeddings.vis_embed."),
    (r"^vis_pe_embed\.", "vlp.embeddings.vis_pe_embed."),
)


def unified_vlp_key_map(task: str) -> KeyMap:
    """The key map from an original checkpoint into the `task` head."""
    drops = {r"^vlp\.pooler\.": f"tanh pooler: no released task or loss reads it; the {task} head does not have it"}
    if task == "vqa":
        drops[r"^cls\.predictions\."] = (
            "masked-LM head: the VQA model (bidirectional, answer classifier) does not use it"
        )
    else:
        drops[r"^ans_classifier\."] = f"VQA answer head: the {task} model has no answer classifier"
    return KeyMap(renames=_RENAMES, drops=drops)


def _card_usage(task: str, folder_name: str, class_name: str) -> str:
    """The model card's usage snippet for the converted task."""
    usage = f"""import vlhub
from transformers import AutoProcessor, {"AutoModelForVisualQuestionAnswering" if task == "vqa" else "AutoModelForImageTextToText"}
processor = AutoProcessor.from_pretrained("{folder_name}")"""
    if task == "vqa":
        usage += f"""
model = AutoModelForVisualQuestionAnswering.from_pretrained("{folder_name}")
answer_ids = model(**processor(text=question, regions=regions)).predicted_answer_ids"""
    else:
        usage += f"""
model = vlhub.{class_name}.from_pretrained("{folder_name}")
captions = processor.batch_decode(model.generate(**processor(regions=regions), max_new_tokens=20, num_beams=5))"""
    return usage


def _converted_processor(task: str, model_config, tok, report: ConversionReport):
    """The processor of the converted model: VLP's renamed tokenizer and the original's region rows as stored. Kept
    apart so that `convert_unified_vlp` stays short."""
    from .. import unified_vlp

    tok = unified_vlp.vlp_release_tokenizer(tok)
    report.notes.append(
        "tokenizer: [unused1] → [X_SEP] and [unused2..11] → [SEP_0..9] in token strings (same ids), as "
        "the original's load_vocab renames them"
    )
    region_processor = unified_vlp.UnifiedVlpRegionProcessor(
        region_feature_dim=model_config.region_feature_dim,
        num_classes=model_config.region_location_dim - 6,
        max_regions=model_config.num_regions,
        min_regions=model_config.num_regions,
        # The original takes the file's rows as stored (fewer or more fail there): vlhub keeps the file's order, pads
        # fewer and keeps the first `num_regions` of more (logged), rather than reordering by confidence.
        region_selection="first_n",
        confidence_threshold=None,
    )
    return unified_vlp.UnifiedVlpProcessor(
        feature_extractor=region_processor, tokenizer=tok, mode="bidirectional" if task == "vqa" else "seq2seq"
    )


class _UnifiedVlpConversion(OriginalConversion):
    """Convert an original Unified VLP checkpoint into a vlhub folder (safetensors, config, processor, model card).

    Args:
        checkpoint: the original `model.{epoch}.bin` (img2txt / CC / COCO / Flickr30k captioning, or vqa2).
        output_dir: the folder to write.
        config: the original `bert_config.json` (bert-base-cased's); without it the sizes are read from the
            checkpoint and the head count inferred.
        task: "captioning" (default without `ans_classifier`), "pretraining", or "vqa" (default with it).
        tokenizer: name, folder or vocab.txt of the cased BERT tokenizer for the processor; saved with VLP's token
            renames (`vlp_release_tokenizer`), so captions decode as the original printed them.
        answers: VQA answer vocabulary (Pythia's `answers_vqa.txt`, one per line); without it the labels are
            `answer_<i>` (noted in the report).
    """

    release = OriginalRelease(ARCHITECTURE, "74c4d852ef62f2aa22b2d0665d78f79a380a30e2", REPORTED_RESULTS, logger)
    renames = _RENAMES
    required = (
        "vlp.embeddings.word_embeddings.weight",
        "vlp.embeddings.vis_embed.0.weight",
        "vlp.embeddings.vis_pe_embed.0.weight",
    )

    def hint(self, raw: dict, missing: list[str]) -> str:
        return " (its region projections are missing: is it a UniLM/BERT text checkpoint?)" if len(missing) < 3 else ""

    def detect(self) -> str:
        return "vqa" if "ans_classifier.0.weight" in self.state_dict else "captioning"

    def check(self) -> None:
        if self.task == "vqa" and self.detected != "vqa":
            raise CheckpointError(
                f"task 'vqa' needs a fine-tuned answer head (ans_classifier.*); {self.checkpoint.name} has none"
            )
        if self.task != "vqa" and "cls.predictions.bias" not in self.state_dict:
            raise CheckpointError(
                f"task {self.task!r} needs the masked-LM head (cls.predictions.*); {self.checkpoint.name} has none"
            )

    def model_config(self) -> tuple:
        from . import UnifiedVlpConfig

        state_dict, notes = self.state_dict, []
        fields = self.bert_fields(
            self.original_config, "vlp.", notes, "the original bert_config.json", ("type_vocab_size",)
        )
        if fields["type_vocab_size"] < 6:
            raise CheckpointError(
                f"the checkpoint has {fields['type_vocab_size']} token types; Unified VLP checkpoints have 6 "
                "(--new_segment_ids). A UniLM/BERT initialisation is not a VLP checkpoint"
            )
        region = state_dict["vlp.embeddings.vis_embed.0.weight"]
        extra = dict(
            region_feature_dim=region.shape[1],
            region_embed_dim=region.shape[0],
            region_location_dim=state_dict["vlp.embeddings.vis_pe_embed.0.weight"].shape[1],
        )
        self.num_labels = state_dict["ans_classifier.2.weight"].shape[0] if self.task == "vqa" else None
        if self.num_labels is not None:
            extra["num_labels"] = self.num_labels
            extra["classifier_hidden_size"] = state_dict["ans_classifier.0.weight"].shape[0]
        notes.append("LayerNorm eps 1e-5 and 100 region slots: fixed in the original code, not in its config")
        return UnifiedVlpConfig.from_original_config(fields, **extra), notes

    def configure(self, model_config, report: ConversionReport) -> None:
        if self.task == "vqa":  # Pythia's answers_vqa.txt, one answer a line (or a JSON list / ans2label)
            note = "no answer vocabulary given (--answers): labels are answer_<i>"
            labels = self.set_given_answer_labels(model_config, self.num_labels, report.notes, note)
            # The original evaluation predicts argmax(logits[:, 1:]) + 1: answer 0 (Pythia's <unk>) never.
            model_config.unknown_answer_id = 0
            report.notes.append(
                f"answer 0 ({labels[0]!r}) is never predicted (unknown_answer_id=0), as the original evaluation"
            )

    def key_map(self, model_config) -> KeyMap:
        return unified_vlp_key_map(self.task)

    def processor(self, model_config, report: ConversionReport):
        tok = self.release.load_tokenizer(self.tokenizer, model_config.vocab_size)
        return _converted_processor(self.task, model_config, tok, report)

    def save_settings(self, model, report: ConversionReport) -> dict:
        return {"usage": _card_usage(self.task, Path(self.output_dir).name, type(model).__name__)}


convert_unified_vlp, add_arguments, convert_from_args = _UnifiedVlpConversion.public_functions(
    checkpoint_help="the original model.{epoch}.bin",
    config_help="the original bert_config.json",
    task_help="head to build (default: vqa if the checkpoint has ans_classifier, else captioning)",
    answers_help="VQA answer vocabulary (answers_vqa.txt, one per line)",
)
ORIGINAL_REPOSITORY, ORIGINAL_COMMIT = (
    _UnifiedVlpConversion.release.original_repository,
    _UnifiedVlpConversion.release.commit,
)
