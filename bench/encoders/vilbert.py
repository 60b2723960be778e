"""ViLBERT VQA at the released size: the 6-layer / 6-co-attention model (`bert_base_6layer_6conect.json`: BERT-base
text stream, 1024-wide 6-layer visual stream, 6 co-attention layers) with the 3129-answer head.

`--original-checkout` takes a checkout of either original repository (jiasenlu/vilbert_beta or
facebookresearch/vilbert-multi-task; both keep the model in `vilbert/vilbert.py`) and times its `VILBertForVLTasks`
built from the checkout's own `config/bert_base_6layer_6conect.json`. As released, that model computes every
pre-training head (MLM over 30522 words at every token, 1601-way region classes at every region, alignment) and,
in the multi-task repository, every task head on every forward, and normalises with a LayerNorm written in Python
(`BertLayerNorm`) unless NVIDIA apex is installed.
"""

import types
from pathlib import Path

import torch

import vlhub

from . import VQA_ANSWERS, import_from_checkout, random_inputs, stub_modules, vqa_model

DESCRIPTION = "ViLBERT 6-layer/6-co-attention VQA"
DEFAULT_REGIONS = 37  # 36 detected regions + the global image token, as the pre-training data
GLOBAL_TOKEN_LOCATION = (0.0, 0.0, 1.0, 1.0, 1.0)
ORIGINAL_CONFIG = "config/bert_base_6layer_6conect.json"


def build(attn_implementation: str, size: str = "base") -> torch.nn.Module:
    return vqa_model(vlhub.VilbertConfig, vlhub.VilbertForQuestionAnswering, attn_implementation, size)


def make_inputs(model, batch: int, text: int, regions: int) -> dict:
    inputs = random_inputs(model.config, batch, text, regions, location_dim=5)
    inputs["region_locations"][:, 0] = torch.tensor(GLOBAL_TOKEN_LOCATION)
    return inputs


ORIGINAL_REPOSITORY = "jiasenlu/vilbert_beta or facebookresearch/vilbert-multi-task"
# Modules the original's `vilbert/utils.py` imports at the top but no model code uses, stubbed when not installed:
# `boto3` / `botocore` (S3 downloads of BERT weights), `tensorboardX` (its training logger) and `torch._six` (removed
# from torch 2; the original imports `inf` from it for gradient clipping). The model classes run as written.
_IMPORT_STUBS = {
    "boto3": {},
    "botocore": {},
    "botocore.exceptions": {"ClientError": type("ClientError", (Exception,), {})},
    "tensorboardX": {"SummaryWriter": object},
    "torch._six": {"inf": float("inf"), "string_classes": (str, bytes)},
}


def build_original(checkout) -> torch.nn.Module:
    """The original `VILBertForVLTasks` (3129 answers) at the released size, from `checkout` (a clone of either
    original repository, both keep the model in `vilbert/vilbert.py`), random weights (its own init), eval. It has
    one attention implementation, the explicit `softmax(QKᵀ/√d + mask)·V`."""
    if not (Path(checkout) / ORIGINAL_CONFIG).is_file():
        raise FileNotFoundError(
            f"{checkout} is not a checkout of the original ViLBERT code: no {ORIGINAL_CONFIG} "
            f"(clone {ORIGINAL_REPOSITORY})"
        )
    with stub_modules(_IMPORT_STUBS):
        original = import_from_checkout(checkout, "vilbert/vilbert.py", "vilbert.vilbert")
    config = original.BertConfig.from_json_file(str(Path(checkout) / ORIGINAL_CONFIG))
    return original.VILBertForVLTasks(config, num_labels=VQA_ANSWERS).eval()


def make_original_inputs(original, batch: int, text: int, regions: int) -> dict:
    """`make_inputs`' tensors (same seed, same values) under the original forward's argument names."""
    sizes = types.SimpleNamespace(
        vocab_size=original.config.vocab_size, region_feature_dim=original.config.v_feature_size
    )
    inputs = random_inputs(sizes, batch, text, regions, location_dim=5)
    inputs["region_locations"][:, 0] = torch.tensor(GLOBAL_TOKEN_LOCATION)
    return {
        "input_txt": inputs["input_ids"],
        "attention_mask": inputs["attention_mask"],
        "token_type_ids": torch.zeros_like(inputs["input_ids"]),
        "input_imgs": inputs["region_features"],
        "image_loc": inputs["region_locations"],
        "image_attention_mask": inputs["region_attention_mask"],
    }
