"""UNITER-base VQA (12 layers, 768 wide, 3129 answers), the released uniter-base size.

With `--original-checkout`, the original code's VQA model (`model/vqa.py`, `UniterForVisualQuestionAnswering` on
`model/model.py`'s `UniterModel`, at the uniter-base sizes of `config/uniter-base.json`) is imported from a checkout of
ChenRocks/UNITER and timed beside vlhub's on the same examples. Its imports need one stand-in, made here and nowhere
else: apex's `FusedLayerNorm` (the original was trained with NVIDIA apex installed) becomes `torch.nn.LayerNorm` when
apex is missing, which is what apex's own CPU path computes (it calls `F.layer_norm` for tensors not on a GPU). The
checkout's `model` folder is loaded as a package without running anything else of the repository (it has no
`__init__.py`; its data, optimisation and Horovod code is never imported). Nothing else is changed.
"""

from pathlib import Path

import torch

import vlhub

from . import VQA_ANSWERS, bert_sizes, import_from_checkout, random_inputs, stub_modules, vqa_model

DESCRIPTION = "UNITER-base VQA"
DEFAULT_REGIONS = 36
ORIGINAL_REPOSITORY = "ChenRocks/UNITER"
_PACKAGE = "uniter_original_model"  # the checkout's model/ folder, loaded under a name no library uses


def build(attn_implementation: str, size: str = "base") -> torch.nn.Module:
    return vqa_model(vlhub.UniterConfig, vlhub.UniterForQuestionAnswering, attn_implementation, size)


def make_inputs(model, batch: int, text: int, regions: int) -> dict:
    return random_inputs(model.config, batch, text, regions, location_dim=7)


# ---- the original code (--original-checkout) ----------------------------------------------------------------------


class OriginalVqa(torch.nn.Module):
    """The original `UniterForVisualQuestionAnswering`, returning its answer scores; `config` is the vlhub config of
    the same sizes (what the examples are drawn from)."""

    def __init__(self, net: torch.nn.Module, config: vlhub.UniterConfig):
        super().__init__()
        self.net, self.config = net, config

    def forward(self, **batch) -> torch.Tensor:
        return self.net(batch, compute_loss=False)


def build_original(checkout, config: vlhub.UniterConfig | None = None) -> torch.nn.Module:
    """The original VQA model at the sizes and answer count of `config` (default: uniter-base, 3129 answers), random
    weights, eval mode."""
    checkout = Path(checkout).expanduser().resolve()
    stubs = {"apex.normalization.fused_layer_norm": {"FusedLayerNorm": torch.nn.LayerNorm}}
    package = {_PACKAGE: {"__path__": [str(checkout / "model")]}}
    with stub_modules(stubs), stub_modules(package, probe=False):
        original_model = import_from_checkout(checkout, "model/model.py", f"{_PACKAGE}.model")
        vqa = import_from_checkout(checkout, "model/vqa.py", f"{_PACKAGE}.vqa")
    answers = VQA_ANSWERS if config is None else config.num_labels
    config = config or vlhub.UniterConfig()
    original_config = original_model.UniterConfig(config.vocab_size, **bert_sizes(config))
    net = vqa.UniterForVisualQuestionAnswering(original_config, config.region_feature_dim, answers)
    return OriginalVqa(net, config).eval()


def make_original_inputs(original, batch: int, text: int, regions: int) -> dict:
    """The examples of `make_inputs` as the original's VQA batch: text ids with their positions, region features and
    7-d positions, one attention mask over text + regions, and the gather index that lays them out (no padding:
    text then regions)."""
    inputs = random_inputs(original.config, batch, text, regions, location_dim=7)
    return {
        "input_ids": inputs["input_ids"],
        "position_ids": torch.arange(text).unsqueeze(0),
        "img_feat": inputs["region_features"],
        "img_pos_feat": inputs["region_locations"],
        "attn_masks": torch.ones(batch, text + regions, dtype=torch.long),
        "gather_index": torch.arange(text + regions).unsqueeze(0).expand(batch, -1).contiguous(),
    }


def copy_original_weights(original, model) -> None:
    """The original's (random) weights into vlhub's model through vlhub's own key map (as `vlhub convert`)."""
    from vlhub.conversion.common import ConversionReport, convert_state_dict
    from vlhub.modeling.uniter.convert_uniter import uniter_key_map

    convert_state_dict(
        original.net.state_dict(),
        model,
        uniter_key_map("vqa", "vqa"),
        ConversionReport(source="original UniterForVisualQuestionAnswering"),
    )
