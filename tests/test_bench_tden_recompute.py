"""The TDEN decoding bench's X-modaler baseline (`bench/bench_tden_decoding.py`, "recompute"): same captions as the
cache, and its extra work is the re-projection X-modaler does (history and regions at every step, not the object
encoder)."""

import importlib.util
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vlhub import TdenConfig, TdenForConditionalGeneration, pack_linear_weights
from vlhub.modeling.packed_linear import packed_linear_available

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_tden_decoding.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_tden_decoding", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_config() -> TdenConfig:
    return TdenConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_visual_layers=2,
        num_cross_encoder_layers=0,
        num_decoder_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=24,
        region_feature_dim=16,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_recompute_baseline_matches_the_cache_and_redoes_only_the_projections(packed):
    """Also on packed weights, where a self-attention's query, key and value are one fused product: the baseline
    re-projects keys and values alone, as X-modaler does."""
    bench = load_bench()
    torch.manual_seed(0)
    config = tiny_config()
    model = TdenForConditionalGeneration(config).eval()
    if packed:
        if not packed_linear_available():
            pytest.skip("this torch build has no oneDNN")
        pack_linear_weights(model)
    batch, regions, steps = 2, 5, 6
    inputs = bench.inputs(model, batch, regions, "cpu")
    hidden, layers = config.hidden_size, config.num_hidden_layers + config.num_decoder_layers
    for beams in (1, 3):
        with torch.no_grad():
            with FlopCounterMode(display=False) as cached_flops:
                cached = bench.run(model, inputs, beams, steps, "cache")
            with FlopCounterMode(display=False) as recompute_flops:
                recomputed = bench.run(model, inputs, beams, steps, "recompute")
        assert torch.equal(cached, recomputed)
        # Step s (0-based) re-projects s earlier inputs per self-attention layer and the regions per decoder layer,
        # on one row per image at step 0 and `beams` rows after; keys and values: 2 products of 2·hidden² FLOPs.
        rows = [1] + [beams] * (steps - 1)
        extra = sum(r * (s * layers + regions * config.num_decoder_layers) for s, r in enumerate(rows))
        extra -= regions * config.num_decoder_layers  # step 0's region keys are computed by the cache run too
        assert recompute_flops.get_total_flops() - cached_flops.get_total_flops() == batch * extra * 2 * 2 * hidden**2
    assert all(not layer.attention.self._forward_pre_hooks for layer in model.tden.encoder.layer)
