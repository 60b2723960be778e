"""VL-BERT-base prec VQA (12 layers, 768 wide, 3129 answers), the released vl-bert-base-prec size fine-tuned for VQA.

With `--original-checkout`, the original code's VQA model (`vqa/modules/resnet_vlbert_for_vqa.py`, `ResNetVLBERT`,
built from the released `cfgs/vqa/base_4x16G_fp32.yaml`: precomputed features, "mlm" answer head) is imported from
a checkout of jackroos/VL-BERT and timed beside vlhub's on the same examples. Its imports need stand-ins for things
the precomputed-feature VQA forward never uses, made here and nowhere else:
  - `boto3` / `botocore` (its copy of pytorch_pretrained_bert imports them for S3 downloads),
  - `common.lib.roi_pooling.C_ROIPooling` (the compiled RoIAlign/RoIPool extension of the end-to-end CNN; only a
    stand-in when the checkout has not built it),
  - `easydict` (its config is an EasyDict; a small attribute dict stands in when the package is missing),
  - PyYAML >= 6 needs a Loader for `yaml.load`, which its `update_config` calls without one (safe_load is used),
  - its tokenizer reads `vocab.txt` from `NETWORK.BERT_MODEL_NAME`: a vocabulary with BERT's special-token ids is
    written to a temporary folder (only the ids of [CLS], [SEP], [MASK] are used),
  - `init_weight` of the "mlm" head copies BERT's pre-trained MLM transform from `pytorch_model.bin`; with random
    weights there is nothing to copy, so that one step is skipped (the layers keep their random initialisation).
Nothing else is changed: LayerNorm is its pure-Python `BertLayerNorm` (apex is not installed), attention its own.
"""

import tempfile
import warnings
from pathlib import Path
from unittest import mock

import torch

import vlhub

from . import AttributeDict, import_from_checkout, stub_modules, vqa_model

DESCRIPTION = "VL-BERT-base prec VQA"
# 36 bottom-up-attention regions plus the whole-image object 0 that VL-BERT always adds.
DEFAULT_REGIONS = 37
ORIGINAL_REPOSITORY = "jackroos/VL-BERT"
IMAGE_SIZE = (480, 640)  # (height, width) of the examples' image, for the pixel boxes the original takes


def build(attn_implementation: str, size: str = "base") -> torch.nn.Module:
    return vqa_model(vlhub.VlBertConfig, vlhub.VlBertForQuestionAnswering, attn_implementation, size)


def _examples(config, batch: int, text: int, regions: int) -> tuple[dict, torch.Tensor]:
    """vlhub's inputs and the same regions' pixel boxes `(batch, regions, 4)`: `[CLS] question [SEP] [MASK] [SEP]`
    (random question ids from 1000 up), object 0 the whole image, then random boxes (seed 0)."""
    if text < 5:
        raise ValueError(f"the VQA layout needs at least 5 tokens, got text={text}")
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1000, config.vocab_size, (batch, text), generator=generator)
    input_ids[:, 0], input_ids[:, -3], input_ids[:, -1] = 101, 102, 102
    input_ids[:, -2] = config.mask_token_id
    token_type_ids = torch.zeros(batch, text, dtype=torch.long)
    token_type_ids[:, -2:] = 1
    height, width = IMAGE_SIZE
    corners = torch.rand(batch, regions, 2, 2, generator=generator).sort(dim=-1).values  # (x or y, low/high)
    boxes = torch.stack(
        [
            corners[..., 0, 0] * (width - 1),
            corners[..., 1, 0] * (height - 1),
            corners[..., 0, 1] * (width - 1),
            corners[..., 1, 1] * (height - 1),
        ],
        dim=-1,
    )
    boxes[:, 0] = torch.tensor([0.0, 0.0, width - 1, height - 1])  # the whole-image box, as the original adds it
    size = torch.tensor([width, height, width, height], dtype=torch.float)
    locations = torch.cat([(boxes[..., :2] + boxes[..., 2:]) / 2, boxes[..., 2:] - boxes[..., :2]], dim=-1) / size
    inputs = {
        "input_ids": input_ids,
        "attention_mask": torch.ones(batch, text, dtype=torch.long),
        "token_type_ids": token_type_ids,
        "region_features": torch.rand(batch, regions, config.region_feature_dim, generator=generator),
        "region_locations": locations,
        "region_attention_mask": torch.ones(batch, regions, dtype=torch.long),
    }
    return inputs, boxes


def make_inputs(model, batch: int, text: int, regions: int) -> dict:
    """`text` tokens laid out `[CLS] question [SEP] [MASK] [SEP]` and `regions` objects (object 0 = whole image)."""
    return _examples(model.config, batch, text, regions)[0]


# ---- the original code (--original-checkout) ----------------------------------------------------------------------


class OriginalVqa(torch.nn.Module):
    """The original `ResNetVLBERT` (VQA), returning its answer logits."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, **inputs) -> torch.Tensor:
        with warnings.catch_warnings():  # torch.meshgrid without indexing=, uint8 masks: old-torch idioms, unchanged
            warnings.simplefilter("ignore", UserWarning)
            return self.net(**inputs)["label_logits"]


def _write_vocab(folder: Path, size: int) -> None:
    """A vocab.txt with BERT-uncased's special-token ids ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103)."""
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [f"token{i}" for i in range(size - len(tokens))]
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n")


def build_original(checkout) -> torch.nn.Module:
    checkout = Path(checkout).expanduser().resolve()
    stubs = {
        "boto3": {},
        "botocore.exceptions": {"ClientError": type("ClientError", (Exception,), {})},
        "easydict": {"EasyDict": AttributeDict},
    }
    extension = (
        {}
        if list((checkout / "common/lib/roi_pooling").glob("C_ROIPooling*"))
        else {"common.lib.roi_pooling.C_ROIPooling": {}}
    )
    with stub_modules(stubs), stub_modules(extension, probe=False):
        config_module = import_from_checkout(checkout, "vqa/function/config.py", "vl_bert_original_vqa_config")
        vqa = import_from_checkout(checkout, "vqa/modules/resnet_vlbert_for_vqa.py", "vl_bert_original_vqa_module")
    yaml = config_module.yaml
    with mock.patch.object(yaml, "load", lambda stream, Loader=yaml.SafeLoader, _load=yaml.load: _load(stream, Loader)):
        config_module.update_config(str(checkout / "cfgs/vqa/base_4x16G_fp32.yaml"))
    config = config_module.config

    class RandomWeightResNetVLBERT(vqa.ResNetVLBERT):
        def init_weight(self):
            pass  # the original copies BERT's pre-trained MLM transform into final_mlp.0 here: no file, random

    with tempfile.TemporaryDirectory() as vocab_folder:
        _write_vocab(Path(vocab_folder), config.NETWORK.VLBERT.vocab_size)
        config.NETWORK.BERT_MODEL_NAME = vocab_folder
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = RandomWeightResNetVLBERT(config)
    # The visual LayerNorms start at weight 0 (from-scratch training: no visual term at all); trained models have
    # non-zero ones, and the logit comparison should see the visual path, so they start at 1 here.
    for norm in (net.vlbert.visual_ln_text, net.vlbert.visual_ln_object):
        torch.nn.init.ones_(norm.weight)
    return OriginalVqa(net).eval()


def make_original_inputs(original, batch: int, text: int, regions: int) -> dict:
    """The examples of `make_inputs` as the original's VQA forward takes them: question ids without the special
    tokens (it adds `[CLS] … [SEP] [MASK] [SEP]` itself), boxes `[x1, y1, x2, y2, feature…]` in pixels with the
    whole-image box first, `im_info` `(width, height, scale, scale)`; no image (precomputed features)."""
    inputs, boxes = _examples(vlhub.VlBertConfig(), batch, text, regions)
    height, width = IMAGE_SIZE
    return {
        "image": None,
        "boxes": torch.cat([boxes, inputs["region_features"]], dim=-1),
        "im_info": torch.tensor([[width, height, 1.0, 1.0]]).expand(batch, 4).contiguous(),
        "question": inputs["input_ids"][:, 1:-3].contiguous(),
    }


def copy_original_weights(original, model) -> None:
    """The original's (random) weights into vlhub's model through vlhub's own key map (as `vlhub convert`)."""
    from vlhub.conversion.common import ConversionReport, convert_state_dict
    from vlhub.modeling.vl_bert.convert_vl_bert import vl_bert_key_map

    state_dict = original.net.state_dict()
    convert_state_dict(
        state_dict,
        model,
        vl_bert_key_map("vqa", "vqa", state_dict.keys()),
        ConversionReport(source="original ResNetVLBERT"),
    )
