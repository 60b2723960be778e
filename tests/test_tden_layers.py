"""TDEN's cross-modal encoder layer (vlhub.modeling.tden.layers_tden)."""

import math

import pytest
import torch
from transformers import BertConfig
from transformers.cache_utils import DynamicCache

import vlhub  # noqa: F401  (registers vlhub before its modules are imported directly)
from vlhub.modeling.layers import extended_attention_mask
from vlhub.modeling.tden.layers_tden import CrossModalLayer


def _config(implementation="eager"):
    config = BertConfig(
        hidden_size=16,
        num_attention_heads=4,
        intermediate_size=24,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config._attn_implementation = implementation
    return config


def _reference(layer, visual, text, mask_2d):
    """Shared attention over [visual | text] written out with plain tensor algebra, then one FFN per modality."""
    attention = layer.biattention
    states = torch.cat([visual, text], dim=1)
    heads, size = 4, 4

    def split(x):
        return x.view(x.shape[0], x.shape[1], heads, size).transpose(1, 2)

    q, k, v = (split(p(states)) for p in (attention.self.query, attention.self.key, attention.self.value))
    scores = q @ k.transpose(-1, -2) / math.sqrt(size) + (1.0 - mask_2d[:, None, None, :].float()) * -10000.0
    context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(states.shape)
    attended = attention.output.LayerNorm(attention.output.dense(context) + states)
    r = visual.shape[1]

    def ffn(x, intermediate, output):
        return output.LayerNorm(output.dense(torch.nn.functional.gelu(intermediate.dense(x))) + x)

    return ffn(attended[:, :r], layer.v_intermediate, layer.v_output), ffn(
        attended[:, r:], layer.t_intermediate, layer.t_output
    )


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_cross_modal_layer_is_shared_attention_then_per_modality_feed_forward(implementation):
    torch.manual_seed(0)
    layer = CrossModalLayer(_config(implementation)).eval()
    visual, text = torch.randn(2, 5, 16), torch.randn(2, 3, 16)
    mask_2d = torch.ones(2, 8, dtype=torch.long)
    mask_2d[1, 3:5] = 0  # two padded regions
    mask_2d[1, 7] = 0  # one padded token
    mask = extended_attention_mask(layer.biattention.self.config, torch.cat([visual, text], 1), mask_2d)
    with torch.no_grad():
        v, t, _ = layer(visual, text, mask)
        v_ref, t_ref = _reference(layer, visual, text, mask_2d)
    torch.testing.assert_close(v, v_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(t, t_ref, atol=1e-5, rtol=0)
    assert layer.v_intermediate is not layer.t_intermediate and layer.v_output is not layer.t_output


def test_cross_modal_layer_reuses_cached_keys_and_values():
    """First call with the regions and a first text chunk, second call with no regions and the next chunk: the new
    tokens see everything before, exactly as in one call over the whole sequence."""
    torch.manual_seed(1)
    layer = CrossModalLayer(_config(), layer_idx=0).eval()
    visual, text = torch.randn(1, 4, 16), torch.randn(1, 5, 16)
    with torch.no_grad():
        _, full, _ = layer(visual, text)
        cache = DynamicCache()
        layer(visual, text[:, :3], cache=cache)
        empty = visual[:, :0]
        _, later, probabilities = layer(empty, text[:, 3:], cache=cache)
    assert cache.get_seq_length(0) == 9 and probabilities.shape == (1, 4, 2, 9)
    torch.testing.assert_close(later, full[:, 3:], atol=1e-5, rtol=0)
