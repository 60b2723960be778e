"""Benchmark cases for bench/bench_encoders.py, one module per architecture.

Each module defines:
    DESCRIPTION: str                                  what is measured, e.g. "UNITER-base VQA"
    DEFAULT_REGIONS: int (optional, default 36)      regions per example when --regions is not given
    build(attn_implementation: str) -> nn.Module      the model at its released size, random weights, eval mode
    make_inputs(model, batch, text, regions) -> dict  keyword arguments of model(**inputs)
and, to be timed against the architecture's original code (`--original-checkout PATH`), optionally:
    build_original(checkout: Path, attn_implementation: str) -> nn.Module | None
        the original repository's model (imported from the user's checkout) at the same size, random weights, eval
        mode; None for an attention implementation the original does not have
    make_original_inputs(model, batch, text, regions) -> dict  keyword arguments of the original model's forward
"""

import torch

VQA_ANSWERS = 3129  # the VQA v2 answer vocabulary of the released fine-tuned models


def vqa_model(config_class, model_class, attn_implementation: str, **config_kwargs) -> torch.nn.Module:
    """`model_class` at `config_class`'s default (released) size with the 3129-answer head, random weights, eval."""
    config = config_class(id2label={i: str(i) for i in range(VQA_ANSWERS)}, **config_kwargs)
    config._attn_implementation = attn_implementation
    return model_class(config).eval()


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
