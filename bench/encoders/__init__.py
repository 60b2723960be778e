"""Benchmark cases for bench/bench_encoders.py, one module per architecture.

Each module defines:
    DESCRIPTION: str                                  what is measured, e.g. "UNITER-base VQA"
    DEFAULT_REGIONS: int (optional, default 36)      regions per example when --regions is not given
    build(attn_implementation: str, size: str = "base") -> nn.Module
                                                      the model at its released size (or the architecture's
                                                      "tiny" preset, a wiring check), random weights, eval mode
    make_inputs(model, batch, text, regions) -> dict  keyword arguments of model(**inputs)

and, for `--original-checkout`, optionally (the original code is imported from the user's checkout while the case
builds it; vlhub never ships it):
    ORIGINAL_REPOSITORY: str                          where the original code lives, e.g. "jackroos/VL-BERT"
    build_original(checkout: Path) -> nn.Module       the original code's model for the same task and size, random
                                                      weights, eval mode; forward(**inputs) returns the answer logits
    make_original_inputs(original, batch, text, regions) -> dict
                                                      the examples of make_inputs, in the original's input format
    copy_original_weights(original, model) -> None    (optional) the original's weights into vlhub's model through
                                                      vlhub's converter, so that the two logits can be compared
"""

import contextlib
import importlib
import importlib.util
import sys
import types
from pathlib import Path

import torch

VQA_ANSWERS = 3129  # the VQA v2 answer vocabulary of the released fine-tuned models


def vqa_model(
    config_class, model_class, attn_implementation: str, size: str = "base", **config_kwargs
) -> torch.nn.Module:
    """`model_class` at `config_class`'s default (released) size with the 3129-answer head, random weights, eval;
    `size="tiny"`: at the architecture's tiny preset instead (its `config_presets`)."""
    if size != "base":
        from vlhub.registry import get_architecture

        config_kwargs = {**get_architecture(config_class.model_type).config_presets[size], **config_kwargs}
    config = config_class(id2label={i: str(i) for i in range(VQA_ANSWERS)}, **config_kwargs)
    config._attn_implementation = attn_implementation
    return model_class(config).eval()


def bert_sizes(config) -> dict:
    """The BERT trunk sizes of a vlhub config, as keyword arguments of the originals' own BERT-style configs (which
    take the vocabulary size first, positionally)."""
    names = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings")
    return {name: getattr(config, name) for name in (*names, "type_vocab_size")}


def random_inputs(config, batch: int, text: int, regions: int, location_dim: int) -> dict:
    """Full-length random text (ids from 1000 up, past BERT's special tokens) and regions (seed 0)."""
    generator = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(1000, config.vocab_size, (batch, text), generator=generator),
        "attention_mask": torch.ones(batch, text, dtype=torch.long),
        "region_features": torch.rand(batch, regions, config.region_feature_dim, generator=generator),
        "region_locations": torch.rand(batch, regions, location_dim, generator=generator),
        "region_attention_mask": torch.ones(batch, regions, dtype=torch.long),
    }


class AttributeDict(dict):
    """A dict with attribute access whose dict values become this class too: what the original code's config
    objects (`easydict.EasyDict`, yacs' `CfgNode`) do, for their stand-ins."""

    def __init__(self, mapping=None, **kwargs):
        super().__init__()
        for key, value in {**(mapping or {}), **kwargs}.items():
            self[key] = value

    def __setitem__(self, key, value):
        if isinstance(value, dict) and not isinstance(value, AttributeDict):
            value = type(self)(value)
        super().__setitem__(key, value)

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError as error:
            raise AttributeError(name) from error

    def __setattr__(self, name, value):
        self[name] = value


@contextlib.contextmanager
def stub_modules(modules: dict, probe: bool = True):
    """While the original code is imported: empty stand-ins `{module name: {attribute: value}}` for packages it
    imports but the benchmarked path never calls (each case says which and why); removed from `sys.modules` again
    afterwards (the imported code keeps its references), so no other library sees them. With `probe`, a module
    that can be imported is left alone and missing parents are stubbed too; without, only the module itself is
    registered and its parents import normally (a compiled extension inside the original's own package)."""
    added = []
    for name, attributes in modules.items():
        if name in sys.modules:
            continue
        if probe:
            try:
                importlib.import_module(name)
                continue
            except ImportError:
                pass
        parts = name.split(".")
        for depth in range(1 if probe else len(parts), len(parts) + 1):
            partial = ".".join(parts[:depth])
            if partial not in sys.modules:
                sys.modules[partial] = types.ModuleType(partial)
                added.append(partial)
                parent = ".".join(parts[: depth - 1])
                if depth > 1 and parent in sys.modules:
                    setattr(sys.modules[parent], parts[depth - 1], sys.modules[partial])
        for key, value in attributes.items():
            setattr(sys.modules[name], key, value)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def import_from_checkout(checkout, relative_file: str, module_name: str | None = None):
    """Import the file `relative_file` of a checkout of an original repository, with the checkout's root first on
    `sys.path` (the original code imports its own packages from there). `module_name` names the loaded module
    (default: its dotted path, e.g. "common.visual_linguistic_bert"). A path that is not such a checkout is an
    error naming the missing file."""
    checkout = Path(checkout).expanduser().resolve()
    path = checkout / relative_file
    if not path.is_file():
        raise FileNotFoundError(f"{checkout} is not a checkout of the expected original repository: no {relative_file}")
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    name = module_name or relative_file.removesuffix(".py").replace("/", ".")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
