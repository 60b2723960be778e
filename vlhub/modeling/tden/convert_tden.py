"""Original TDEN checkpoints (X-modaler's checkpointer files, `model_final.pth`) → vlhub folders.

X-modaler saves `{"model": state_dict, "trainer": {...}, "iteration": int}` (fvcore's `Checkpointer`); only the model
entry is read, the trainer state (optimizer, scheduler) is ignored. The key map renames X-modaler's modules to
vlhub's (`token_embed` → `tden.embeddings`, `encoder.layers` → `tden.encoder.layer`, `encoder.v_layers` →
`tden.visual_encoder.layer`, `decoder.u_layers` → `tden.cross_encoder.layer`, `decoder.g_layers.N.{self_attn,x_att}`
→ `tden.decoder.layer.N.{attention,crossattention}`, `predictor` → `lm_head` or `answer_head`, `v_predictor` →
`region_head`, `similarity_predictor` → `similarity`). What is TDEN's own: the LM bias registered twice
(`predictor.bias` is also `predictor.decoder.bias`; checked identical and kept once), the BatchNorm running
statistics of the matching poolers (converted: eval mode uses them), which modules each task's head owns (the rest
is dropped with a reason, as X-modaler's non-strict loading between tasks does), and the config read from the
weights' shapes plus the original `config.yaml` (heads, sequence and region limits, answer vocabulary).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

from ...utils.files import read_yaml
from . import ARCHITECTURE, TdenConfig, TdenProcessor, TdenRegionProcessor
from ...conversion.common import (
    CheckpointError,
    ConversionReport,
    KeyMap,
    OriginalConversion,
    OriginalRelease,
    inferred_attention_heads,
    layer_count,
    load_torch_state_dict,
)
from .reported_results import REPORTED_RESULTS

logger = logging.getLogger(__name__)

__all__ = [
    "convert_tden",
    "convert_from_args",
    "add_arguments",
    "detect_tden_task",
    "tden_key_map",
    "load_tden_checkpoint",
    "TDEN_TASKS",
    "ORIGINAL_REPOSITORY",
    "ORIGINAL_COMMIT",
]

_META_ARCHITECTURES = {
    "TDENPretrain": ("pretraining",),
    "TDENCaptioner": ("captioning",),
    "TDENRetrieval": ("retrieval",),
    "TDENBiTransformer": ("vqa", "vcr"),
}
# X-modaler's defaults per task (MAX_SEQ_LEN, MAX_FEAT_NUM - 1) when no config.yaml is given.
_TEXT_LIMITS = {"pretraining": 36, "captioning": 20, "vqa": 23, "retrieval": 30, "vcr": 38}
_REGION_LIMITS = {"pretraining": 50, "captioning": 50, "vqa": 100, "retrieval": 50, "vcr": 50}
_DUPLICATE = "#duplicate"

_RENAMES = (
    (r"^token_embed\.embeddings\.weight$", "tden.embeddings.word_embeddings.weight"),
    (r"^token_embed\.embeddings_norm\.", "tden.embeddings.LayerNorm."),
    (r"^token_embed\.embeddings_pos\.position_embeddings\.", "tden.embeddings.position_embeddings."),
    (r"^token_embed\.embeddings_token_type\.", "tden.embeddings.token_type_embeddings."),
    (r"^visual_embed\.embeddings\.", "tden.region_embeddings.feature_embeddings."),
    (r"^visual_embed\.embeddings_norm\.", "tden.region_embeddings.LayerNorm."),
    (r"^visual_embed\.embeddings_pos\.", "tden.region_embeddings.location_embeddings."),
    (r"^encoder\.layers\.", "tden.encoder.layer."),
    (r"^encoder\.v_layers\.", "tden.visual_encoder.layer."),
    (r"^decoder\.u_layers\.", "tden.cross_encoder.layer."),
    (r"^decoder\.g_layers\.(\d+)\.self_attn\.", r"tden.decoder.layer.\1.attention."),
    (r"^decoder\.g_layers\.(\d+)\.x_att\.", r"tden.decoder.layer.\1.crossattention."),
    (r"^decoder\.g_layers\.", "tden.decoder.layer."),
    (r"^predictor\.(u_pooler|v_pooler|u_logits|g_pooler|g_logits)\.", r"answer_head.\1."),
    (r"^predictor\.bias$", "lm_head.decoder.bias"),
    (r"^predictor\.decoder\.bias$", "lm_head.decoder.bias" + _DUPLICATE),
    (r"^predictor\.", "lm_head."),
    (r"^v_predictor\.transform\.dense\.", "region_head.net.0."),
    (r"^v_predictor\.transform\.LayerNorm\.", "region_head.net.2."),
    (r"^v_predictor\.decoder\.", "region_head.net.3."),
    (r"^similarity_predictor\.", "similarity."),
)
# The modules each task's head owns (by vlhub key prefix); the others are dropped when converting across tasks.
_OWNED = {
    "pretraining": ("tden.cross_encoder.", "tden.decoder.", "lm_head.", "region_head.", "similarity."),
    "captioning": ("tden.decoder.", "lm_head."),
    "vqa": ("tden.cross_encoder.", "tden.decoder.", "answer_head."),
    "retrieval": ("similarity.",),
    "vcr": ("tden.cross_encoder.", "answer_head.u_pooler.", "answer_head.v_pooler.", "answer_head.u_logits."),
}
_MODULE_ROLES = {
    "tden.cross_encoder.": "cross-modal encoder layers",
    "tden.decoder.": "decoder layers",
    "lm_head.": "language-model head (MLM/MSG/captioning)",
    "region_head.": "masked object classification head",
    "similarity.": "image-sentence matching poolers",
    "answer_head.": "VQA/VCR answer head",
}


def load_tden_checkpoint(checkpoint: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model entry of an X-modaler checkpoint (or a bare state dict), read with `torch.load(weights_only=True)`.

    A file holding only trainer state (optimizer / scheduler / iteration, no `model` entry) or anything else that is
    not a state dict raises `CheckpointError` naming what it holds."""
    try:
        return load_torch_state_dict(checkpoint)
    except CheckpointError as err:
        path = Path(checkpoint)
        if not path.is_file() or path.stat().st_size == 0:
            raise
        try:
            container = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:
            raise err from None
        if (
            isinstance(container, dict)
            and "model" not in container
            and ({"trainer", "optimizer", "scheduler", "iteration"} & set(container))
        ):
            raise CheckpointError(
                f"{path.name} holds only trainer state ({sorted(container)}) and no 'model' entry: it is an X-modaler "
                "checkpoint without weights; convert the file saved with the model (e.g. model_final.pth)"
            ) from None
        raise


def detect_tden_task(state_dict: dict) -> str:
    """Which X-modaler meta-architecture saved this state dict, from its head keys."""
    has = lambda prefix: any(k.startswith(prefix) for k in state_dict)  # noqa: E731
    if has("v_predictor.") or (has("similarity_predictor.") and has("decoder.")):
        return "pretraining"
    if has("similarity_predictor."):
        return "retrieval"
    if has("predictor.u_pooler."):
        return (
            "vcr"
            if state_dict["predictor.u_logits.1.weight"].shape[0] == 1 and not has("predictor.g_pooler.")
            else "vqa"
        )
    if has("predictor.transform.") and has("decoder.g_layers."):
        return "captioning"
    raise CheckpointError(
        "the checkpoint has none of the heads of TDEN's releases (predictor, v_predictor, "
        "similarity_predictor): cannot tell its task; pass --task"
    )


def tden_key_map(task: str, detected: str) -> KeyMap:
    """The key map converting a `detected`-task checkpoint into the `task` head."""
    drops = {
        re.escape(_DUPLICATE) + "$": (
            "X-modaler registers the LM bias twice (predictor.bias is also predictor.decoder.bias; checked identical); "
            "kept once as lm_head.decoder.bias"
        )
    }
    for prefix, role in _MODULE_ROLES.items():
        owned = _OWNED[task]
        if any(o.startswith(prefix) for o in owned):
            continue
        drops["^" + re.escape(prefix)] = (
            f"{role}: the {task} head does not have them (the checkpoint is a {detected} model)"
        )
    if task == "vcr":
        drops[r"^answer_head\.(g_pooler|g_logits)\."] = (
            "the VCR head has no generation branch (the release has no decoder)"
        )
    return KeyMap(renames=_RENAMES, drops=drops)


def _read_original_config(config) -> dict:
    if config is None:
        return {}
    if isinstance(config, dict):
        return config
    data = read_yaml(config, "the original X-modaler config")
    if not isinstance(data, dict) or "MODEL" not in data:
        raise CheckpointError(f"{config} is not an X-modaler config (no MODEL section)")
    return data


def _config_from_checkpoint(state_dict: dict, original: dict, task: str, detected: str) -> tuple[TdenConfig, list[str]]:
    notes = []
    model = original.get("MODEL", {})
    bert = model.get("BERT", {})
    word = state_dict["token_embed.embeddings.weight"]
    hidden = word.shape[1]
    fields = dict(
        vocab_size=word.shape[0],
        hidden_size=hidden,
        max_position_embeddings=state_dict["token_embed.embeddings_pos.position_embeddings.weight"].shape[0],
        type_vocab_size=state_dict["token_embed.embeddings_token_type.weight"].shape[0],
        intermediate_size=state_dict["encoder.layers.0.intermediate.dense.weight"].shape[0],
        num_hidden_layers=layer_count(state_dict, "encoder.layers."),
        num_visual_layers=layer_count(state_dict, "encoder.v_layers."),
        num_cross_encoder_layers=layer_count(state_dict, "decoder.u_layers."),
        num_decoder_layers=layer_count(state_dict, "decoder.g_layers."),
        region_feature_dim=state_dict["visual_embed.embeddings.weight"].shape[1],
        region_location_dim=state_dict["visual_embed.embeddings_pos.weight"].shape[1],
    )
    for name, key in (
        ("hidden_size", "HIDDEN_SIZE"),
        ("vocab_size", None),
        ("num_hidden_layers", "NUM_HIDDEN_LAYERS"),
        ("num_visual_layers", "V_NUM_HIDDEN_LAYERS"),
        ("intermediate_size", "INTERMEDIATE_SIZE"),
    ):
        value = model.get("VOCAB_SIZE") if key is None else bert.get(key)
        if value is not None and value != fields[name]:
            raise CheckpointError(f"the config says {name}={value} but the checkpoint has {fields[name]}")
    if "NUM_ATTENTION_HEADS" in bert:
        fields["num_attention_heads"] = int(bert["NUM_ATTENTION_HEADS"])
    else:
        fields["num_attention_heads"] = inferred_attention_heads(hidden, notes, "the original config.yaml")
    if "HIDDEN_ACT" in bert:
        fields["hidden_act"] = str(bert["HIDDEN_ACT"])
    if "v_predictor.decoder.weight" in state_dict:
        fields["num_region_labels"] = state_dict["v_predictor.decoder.weight"].shape[0]
    if "similarity_predictor.t_pooler.embed.weight" in state_dict:
        fields["similarity_pooler_size"] = state_dict["similarity_predictor.t_pooler.embed.weight"].shape[0]
        fields["similarity_pooler_batchnorm"] = "similarity_predictor.t_pooler.bn.weight" in state_dict
    if "predictor.u_pooler.embed.weight" in state_dict:
        fields["classifier_pooler_size"] = state_dict["predictor.u_pooler.embed.weight"].shape[0]
        fields["classifier_pooler_batchnorm"] = "predictor.u_pooler.bn.weight" in state_dict
    # What the task's head has: the captioner has no cross-modal encoder, retrieval neither nor a decoder, VCR no
    # decoder; the VQA/VCR decoder reads the question bidirectionally.
    if task in ("captioning", "retrieval"):
        fields["num_cross_encoder_layers"] = 0
    if task in ("retrieval", "vcr"):
        fields["num_decoder_layers"] = 0
    fields["bidirectional_decoder"] = task in ("vqa", "vcr")
    for name in ("num_cross_encoder_layers", "num_decoder_layers"):
        if task in ("pretraining", "vqa") and fields[name] == 0:
            raise CheckpointError(f"a {task} head needs {name} > 0, but the {detected} checkpoint has none")
    if task == "captioning" and fields["num_decoder_layers"] == 0:
        raise CheckpointError(
            f"the {detected} checkpoint has no decoder layers (decoder.g_layers), so it cannot "
            "caption; convert it with --task retrieval or vqa"
        )
    if task == "vcr":
        fields["num_labels"] = 1
    if task == "retrieval" and "similarity_predictor.t_pooler.embed.weight" not in state_dict:
        raise CheckpointError(
            f"the {detected} checkpoint has no image-sentence matching poolers (similarity_predictor), "
            "so it cannot score image-text pairs; convert a retrieval or pre-training checkpoint"
        )
    return TdenConfig(**fields), notes


def _text_limit(original: dict, task: str) -> int:
    """X-modaler's text limit `MAX_SEQ_LEN`, from the original config or its default for `task`."""
    return int(original.get("MODEL", {}).get("MAX_SEQ_LEN", _TEXT_LIMITS[task]))


def _converted_processor(original: dict, task: str, model_config, tok, report: ConversionReport):
    """The processor with X-modaler's data-loader rules from the original config: the text limit `MAX_SEQ_LEN`
    (`_text_limit`), the first `MAX_FEAT_NUM - 1` regions of each feature file (`[IMG]` their mean)."""
    dataloader = original.get("DATALOADER", {})
    max_regions = int(dataloader["MAX_FEAT_NUM"]) - 1 if "MAX_FEAT_NUM" in dataloader else _REGION_LIMITS[task]
    report.notes.append(
        f"processor max_regions {max_regions}, region_selection 'first_n': X-modaler keeps the first "
        "MAX_FEAT_NUM - 1 regions of each feature file and averages them into [IMG]"
    )
    return TdenProcessor(
        feature_extractor=TdenRegionProcessor(
            region_feature_dim=model_config.region_feature_dim, max_regions=max_regions, region_selection="first_n"
        ),
        tokenizer=tok,
        max_text_length=_text_limit(original, task),
        text_stream="generation" if task == "captioning" else "understanding",
    )


def _set_caption_decoding(model, model_config, original: dict, max_text: int) -> None:
    """The captioner's generation defaults as X-modaler decodes (length, beams, plain log-prob sum). Kept apart so
    that `convert_tden` stays short."""
    # The decoder reads [CLS] + at most MAX_SEQ_LEN - 1 words; it then emits up to MAX_SEQ_LEN tokens.
    model.generation_config.max_new_tokens = max_text
    beams = int(original.get("DECODE_STRATEGY", {}).get("BEAM_SIZE", 2))  # X-modaler decodes COCO with beam 2
    if beams > 1:
        model.generation_config.num_beams = beams
        model.generation_config.length_penalty = 0.0  # the original ranks beams by the plain sum of log-probs
    model.generation_config.decoder_start_token_id = model_config.bos_token_id


class _TdenConversion(OriginalConversion):
    """Convert an X-modaler TDEN checkpoint into a vlhub folder (safetensors, config, processor, model card).

    Args:
        checkpoint: X-modaler's `.pth` (`{"model": ..., "trainer": ..., "iteration": ...}`, or a bare state dict).
        output_dir: the folder to write.
        config: the original `config.yaml` (the merged config X-modaler writes beside its checkpoints): attention
            heads, `MAX_SEQ_LEN`, `MAX_FEAT_NUM`, the meta-architecture. Without it the sizes come from the weights,
            the heads from the hidden size (768 → 12), the limits from X-modaler's defaults per task.
        task: one of `TDEN_TASKS`; default: detected from the keys. A pre-training checkpoint converts to every
            task (the task's new head parameters are freshly initialised and listed in the report).
        tokenizer: name, folder or vocab.txt of the uncased BERT tokenizer for the processor.
        answers: the VQA answer list (`trainval_label2ans.pkl` or an ans2label dict pickle); default: looked for
            beside the checkpoint.
    """

    release = OriginalRelease(ARCHITECTURE, "ed1f5590d1eb407da3b5df8d9df35488206f14d3", REPORTED_RESULTS, logger)
    required = (
        "token_embed.embeddings.weight",
        "visual_embed.embeddings.weight",
        "encoder.layers.0.attention.self.query.weight",
    )

    def load(self) -> tuple[dict, dict]:
        """The model entry of X-modaler's file (its keys need no renaming to be read)."""
        raw = load_tden_checkpoint(self.checkpoint)
        if not all(k in raw for k in self.required):
            raise CheckpointError(
                f"{self.checkpoint.name} is not an X-modaler TDEN checkpoint: it lacks "
                f"{[k for k in self.required if k not in raw]} (first keys: {list(raw)[:5]})"
            )
        return raw, raw

    def read_config(self) -> dict:
        return _read_original_config(self.config)

    def detect(self) -> str:
        detected = detect_tden_task(self.raw)
        meta = self.original_config.get("MODEL", {}).get("META_ARCHITECTURE")
        if meta is not None and detected not in _META_ARCHITECTURES.get(meta, (detected,)):
            raise CheckpointError(
                f"the config's META_ARCHITECTURE {meta} does not match the checkpoint's heads ({detected})"
            )
        return detected

    def check(self) -> None:
        raw = self.raw
        if "predictor.decoder.bias" in raw:
            if "predictor.bias" not in raw or not torch.equal(raw["predictor.bias"], raw["predictor.decoder.bias"]):
                raise CheckpointError(
                    "predictor.decoder.bias should be the same tensor as predictor.bias (X-modaler "
                    "registers the LM bias twice), but they differ"
                )

    def model_config(self) -> tuple[TdenConfig, list[str]]:
        return _config_from_checkpoint(self.raw, self.original_config, self.task, self.detected)

    def configure(self, model_config: TdenConfig, report: ConversionReport) -> None:
        if self.task == "vqa":
            # A fine-tuned head fixes the number of answers; a new head (from a pre-training checkpoint) takes the list's.
            head = self.raw.get("predictor.u_logits.1.weight")
            num_answers = head.shape[0] if head is not None else None
            self.set_answer_file_labels(
                model_config, num_answers, ("trainval_label2ans.pkl",), 1, "trainval_label2ans.pkl"
            )

    def key_map(self, model_config: TdenConfig) -> KeyMap:
        return tden_key_map(self.task, self.detected)

    def finish(self, model, report: ConversionReport) -> None:
        if self.task == "captioning":
            _set_caption_decoding(
                model, model.config, self.original_config, _text_limit(self.original_config, self.task)
            )

    def processor(self, model_config: TdenConfig, report: ConversionReport) -> TdenProcessor:
        tok = self.release.load_tokenizer(self.tokenizer, model_config.vocab_size)
        return _converted_processor(self.original_config, self.task, model_config, tok, report)


convert_tden, add_arguments, convert_from_args = _TdenConversion.public_functions(
    checkpoint_help="X-modaler's .pth (model_final.pth, model_Epoch_*.pth)",
    config_help="the original config.yaml (X-modaler's merged config beside the checkpoint)",
    answers_help="VQA answer list trainval_label2ans.pkl (default: looked for beside the checkpoint)",
)
ORIGINAL_REPOSITORY, ORIGINAL_COMMIT = _TdenConversion.release.original_repository, _TdenConversion.release.commit
TDEN_TASKS = _TdenConversion.tasks  # the task names the converter takes: the architecture's heads
