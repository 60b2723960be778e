"""X-modaler's own TDEN captioner and decoders, built from a checkout of YehLi/xmodaler, for
`bench/bench_tden_decoding.py --original-checkout` (vlhub never ships that code: it is imported from the checkout).

The model is X-modaler's `TDENCaptioner` (`xmodaler/modeling/meta_arch/tden.py`) built by X-modaler's own config
system and registry from the checkout's `configs/image_caption/tden/tden.yaml` (as `train_net.setup()` does:
defaults, the meta-architecture's `add_config`, the yaml, then overrides), with `MODEL.MAX_SEQ_LEN` set to the
bench's steps and `MODEL.DEVICE` to its device; sizes can be overridden (the tests build a tiny one). It decodes
with its own `GreedyDecoder` and `BeamSearcher` (`xmodaler/modeling/decode_strategy/`), called as X-modaler's
evaluator calls them: `model(batch, use_beam_search=...)`. Its weights are its own (PyTorch's default init).

X-modaler's requirements are not vlhub's, and none is installed for this. Stand-ins, made here and active only while
the checkout's code is imported and the model is built (`encoders.stub_modules`), replace what the decoding path
never calls or needs only in a trivial form:
  - `fvcore.common.config.CfgNode` (its yacs config node): a dict with attribute access, deep-copy `clone`, yaml
    loading with `_BASE_`, recursive merge and `merge_from_list` -- the part `get_cfg`/`merge_from_file` use,
  - `fvcore.common.registry.Registry`: register by class name, `get`,
  - `iopath.common.file_io` (X-modaler's `PathManager`, used to open the yaml): local files only,
  - `omegaconf.DictConfig` (only tested with `isinstance` by `@configurable`),
  - `pytorch_transformers.tokenization_utils.PreTrainedTokenizer` (base class of its `BertTokenizer`, only used
    to turn ids into sentences, `output_sents=True`, which the bench does not ask for). The decoders take the ids of
    [CLS] and [SEP] from that tokenizer's vocabulary while they are built: a stand-in with the vlhub config's
    `bos_token_id` / `eos_token_id` (101 / 102 in BERT's uncased vocabulary) is given instead.
X-modaler hard-codes CUDA for new tensors (`.cuda()` in both decoders, in `get_extended_attention_mask` and in the
position embedding at a decoding step). On the CPU, `cuda_calls_stay_on_cpu()` makes `torch.Tensor.cuda` return the
tensor itself while the original decodes (the same shim the TDEN parity fixtures were made with); the checkout is
never edited.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import types
from pathlib import Path
from unittest import mock

import torch
import yaml

from encoders import AttributeDict, import_from_checkout, stub_modules

ORIGINAL_REPOSITORY = "YehLi/xmodaler"
CAPTION_CONFIG = "configs/image_caption/tden/tden.yaml"


class _CfgNode(AttributeDict):
    """The part of yacs' / fvcore's `CfgNode` X-modaler's `get_cfg`, `add_config` and `merge_from_file` use."""

    def __init__(self, init_dict=None, key_list=None, new_allowed=False):
        super().__init__(init_dict)

    def clone(self):
        return copy.deepcopy(self)

    @classmethod
    def _open_cfg(cls, filename):
        return open(filename, encoding="utf-8")

    @classmethod
    def load_yaml_with_base(cls, filename, allow_unsafe=False):
        with cls._open_cfg(filename) as f:
            loaded = yaml.safe_load(f)
        base = loaded.pop("_BASE_", None)
        if base is None:
            return loaded
        merged = cls.load_yaml_with_base(str(Path(filename).parent / base))
        _merge(merged, loaded)
        return merged

    def merge_from_other_cfg(self, other):
        _merge(self, other)

    def merge_from_list(self, pairs):
        for dotted, value in zip(pairs[0::2], pairs[1::2]):
            *parents, leaf = dotted.split(".")
            node = self
            for name in parents:
                node = node[name]
            if leaf not in node:
                raise KeyError(f"no config key {dotted}")
            node[leaf] = value


def _merge(target: dict, source: dict) -> None:
    for key, value in source.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value  # a dict becomes a node (AttributeDict.__setitem__)


class _Registry:
    """fvcore's `Registry`: objects registered under their `__name__`, fetched by name."""

    def __init__(self, name):
        self._name, self._objects = name, {}

    def register(self, obj=None):
        def add(item):
            self._objects[item.__name__] = item
            return item

        return add if obj is None else add(obj)

    def get(self, name):
        if name not in self._objects:
            raise KeyError(f"no object named {name!r} in the {self._name} registry")
        return self._objects[name]

    def __contains__(self, name):
        return name in self._objects


class _PathManager:
    """iopath's `PathManager` for local files."""

    open = staticmethod(open)
    isfile = staticmethod(lambda path: Path(path).is_file())

    def register_handler(self, handler):
        pass


_IMPORT_STUBS = {
    "fvcore.common.config": {"CfgNode": _CfgNode},
    "fvcore.common.registry": {"Registry": _Registry},
    "iopath.common.file_io": {
        "PathManager": _PathManager,
        "PathHandler": object,
        "HTTPURLHandler": object,
        "OneDrivePathHandler": object,
    },
    "omegaconf": {"DictConfig": type("DictConfig", (dict,), {}), "ListConfig": list, "OmegaConf": object},
    "pytorch_transformers.tokenization_utils": {"PreTrainedTokenizer": object},
}


@contextlib.contextmanager
def cuda_calls_stay_on_cpu(device: str):
    """On the CPU, `Tensor.cuda()` returns the tensor itself (X-modaler calls it on the tensors it creates)."""
    if str(device).startswith("cuda"):
        yield
        return
    with mock.patch.object(torch.Tensor, "cuda", lambda self, *args, **kwargs: self):
        yield


def build_original(checkout, config, steps: int, device: str = "cpu") -> torch.nn.Module:
    """X-modaler's `TDENCaptioner` at `config`'s sizes (a vlhub `TdenConfig`: hidden size, heads, feed-forward,
    layers, vocabulary, positions, region feature size), decoding `steps` tokens, random weights, eval mode."""
    checkout = Path(checkout).expanduser().resolve()
    if not (checkout / CAPTION_CONFIG).is_file():
        raise FileNotFoundError(
            f"{checkout} is not a checkout of X-modaler ({ORIGINAL_REPOSITORY}): no {CAPTION_CONFIG}"
        )
    tokenizer = types.SimpleNamespace(
        from_pretrained=lambda *args, **kwargs: types.SimpleNamespace(
            vocab={"[CLS]": config.bos_token_id, "[SEP]": config.eos_token_id}
        )
    )
    with stub_modules(_IMPORT_STUBS):
        modeling = import_from_checkout(checkout, "xmodaler/modeling/__init__.py", "xmodaler.modeling")
        xconfig = importlib.import_module("xmodaler.config")
        strategy = importlib.import_module("xmodaler.modeling.decode_strategy.decode_strategy")
        cfg = xconfig.get_cfg()
        yaml_file = str(checkout / CAPTION_CONFIG)
        logging.getLogger("xmodaler").setLevel(logging.ERROR)  # "no VERSION, assuming the latest" is expected
        modeling.add_config(cfg, cfg.load_from_file_tmp(yaml_file))
        cfg.merge_from_file(yaml_file)
        cfg.merge_from_list(
            [
                "MODEL.DEVICE",
                device,
                "MODEL.MAX_SEQ_LEN",
                steps,
                "MODEL.VOCAB_SIZE",
                config.vocab_size,
                "MODEL.BERT.HIDDEN_SIZE",
                config.hidden_size,
                "MODEL.BERT.NUM_ATTENTION_HEADS",
                config.num_attention_heads,
                "MODEL.BERT.INTERMEDIATE_SIZE",
                config.intermediate_size,
                "MODEL.BERT.NUM_HIDDEN_LAYERS",
                config.num_hidden_layers,
                "MODEL.BERT.V_NUM_HIDDEN_LAYERS",
                config.num_visual_layers,
                "MODEL.BERT.NUM_GENERATION_LAYERS",
                config.num_decoder_layers,
                "MODEL.TOKEN_EMBED.DIM",
                config.hidden_size,
                "MODEL.TOKEN_EMBED.POSITION_MAX_LEN",
                config.max_position_embeddings,
                "MODEL.TOKEN_EMBED.TYPE_VOCAB_SIZE",
                config.type_vocab_size,
                "MODEL.VISUAL_EMBED.IN_DIM",
                config.region_feature_dim,
                "MODEL.VISUAL_EMBED.OUT_DIM",
                config.hidden_size,
            ]
        )
        with mock.patch.object(strategy, "BertTokenizer", tokenizer):
            model = modeling.build_model(cfg)
    model.kfg = xconfig.kfg  # X-modaler's input/output key names
    return model.eval()


def original_inputs(original, inputs: dict, steps: int) -> dict:
    """The bench's vlhub inputs as X-modaler's decoders take a batch (what its `preprocess_batch` returns): region
    features and 5-d locations as they are ([IMG] first), a float region mask, generation token types (1) for the
    `steps` positions, ids."""
    kfg, features = original.kfg, inputs["region_features"]
    return {
        kfg.ATT_FEATS: features,
        kfg.ATT_FEATS_LOC: inputs["region_locations"],
        kfg.ATT_MASKS: inputs["region_attention_mask"].to(features.dtype),
        kfg.G_TOKENS_TYPE: torch.ones(features.shape[0], steps, dtype=torch.long, device=features.device),
        kfg.IDS: [str(i) for i in range(features.shape[0])],
    }


def decode_original(original, batch: dict, beams: int) -> torch.Tensor:
    """X-modaler's greedy decoder (`beams` 1) or beam searcher: the caption ids `(batch, steps)`, without [CLS]."""
    original.beam_searcher.beam_size = beams  # cfg.DECODE_STRATEGY.BEAM_SIZE, read at every call
    with cuda_calls_stay_on_cpu(batch[original.kfg.ATT_FEATS].device.type):
        # The decoders add their state to the dict they are given: a fresh one per call.
        return original(dict(batch), use_beam_search=beams > 1)[original.kfg.G_SENTS_IDS]


def suppress_eos(original, eos_token_id: int) -> None:
    """Lower the EOS logit's bias by 1e4 so that no row ends early (every row decodes all steps): its probability
    underflows to 0 and the other log-probs are unchanged. Copied weights carry it into vlhub's model."""
    with torch.no_grad():
        original.predictor.bias[eos_token_id] -= 1e4


def copy_original_weights(original, model) -> None:
    """The original's weights into vlhub's `TdenForConditionalGeneration` through vlhub's converter's key map (as
    `vlhub convert tden` does with a captioning checkpoint); every key must be used and every parameter set."""
    from vlhub.conversion.common import ConversionReport, convert_state_dict
    from vlhub.modeling.tden.convert_tden import tden_key_map

    report = ConversionReport(source="X-modaler TDENCaptioner")
    convert_state_dict(original.state_dict(), model, tden_key_map("captioning", "captioning"), report)
    if report.initialized:
        raise RuntimeError(f"vlhub parameters the original's weights did not set: {sorted(report.initialized)}")


_ROLES = (  # (pattern on the module's name in X-modaler's model, what that linear layer does while decoding)
    (r"^encoder\.v_layers\.|^visual_embed\.", "object encoder and region embedding (once per caption)"),
    (
        r"^encoder\.layers\.\d+\.attention\.self\.(key|value)$",
        "sentence encoder: keys/values of all earlier inputs, re-projected every step",
    ),
    (
        r"^decoder\.g_layers\.\d+\.self_attn\.self\.(key|value)$",
        "decoder self-attention: keys/values of all earlier inputs, re-projected every step",
    ),
    (
        r"^decoder\.g_layers\.\d+\.x_att\.self\.(key|value)$",
        "decoder cross-attention: keys/values of the regions, re-projected every step",
    ),
    (r"^predictor\.decoder$", "LM head's vocabulary projection"),
    (r"", "other linear layers of a step (queries, attention outputs, feed-forward, LM transform)"),
)


def profile_original(original, batch: dict, beams: int, top: int = 12) -> None:
    """Print where one decode of X-modaler's model spends its time: its linear layers' wall time and FLOPs by role
    (forward hooks), the rest (attention products, softmax, LayerNorm, GELU, history concatenation, beam
    bookkeeping, Python), and torch.profiler's operators by self CPU time."""
    import re
    import time

    totals: dict[str, list[float]] = {role: [0.0, 0.0] for _, role in _ROLES}
    starts: dict[str, float] = {}
    hooks = []
    for name, module in original.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        role = next(role for pattern, role in _ROLES if re.search(pattern, name))

        def pre(module, args, name=name):
            starts[name] = time.perf_counter()

        def post(module, args, output, name=name, role=role):
            totals[role][0] += time.perf_counter() - starts[name]
            totals[role][1] += 2 * args[0].numel() * module.out_features / 1e9

        hooks += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        with torch.no_grad():
            decode_original(original, batch, beams)  # warm-up
            for values in totals.values():
                values[:] = [0.0, 0.0]
            start = time.perf_counter()
            decode_original(original, batch, beams)
            total = time.perf_counter() - start
    finally:
        for hook in hooks:
            hook.remove()
    images = batch[original.kfg.ATT_FEATS].shape[0]
    print(f"\nX-modaler's decoding, batch {images}, beams {beams}: {total:.3f} s (forward hooks on its linear layers)")
    print("| part | s | share | GFLOP |")
    print("| --- | --- | --- | --- |")
    for role, (seconds, gflop) in totals.items():
        print(f"| {role} | {seconds:.3f} | {100 * seconds / total:.0f}% | {gflop:.1f} |")
    rest = total - sum(seconds for seconds, _ in totals.values())
    print(
        f"| everything else (attention products and softmax, LayerNorm, GELU, history concatenation, beam "
        f"bookkeeping, Python) | {rest:.3f} | {100 * rest / total:.0f}% | |"
    )
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        decode_original(original, batch, beams)
    print(f"\ntorch.profiler, operators by self CPU time (top {top}):")
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
