"""Linear layers on oneDNN-packed weights (`vlhub.pack_linear_weights`): the same linear map and the same captions,
the same parameters, the plain path wherever packing does not apply, and re-packing after the weights change."""

import copy
import io

import pytest
import torch
from torch import nn

import vlhub
from vlhub.modeling.packed_linear import PackedLinear, packed_linear_available

pytestmark = pytest.mark.skipif(not packed_linear_available(), reason="this torch build has no oneDNN")


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 20), nn.GELU(), nn.Linear(20, 7, bias=False))


def test_packed_layers_compute_the_same_map_and_keep_their_parameters():
    net = small_net()
    keys = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(3, 5, 12)
    expected = net(x)
    assert vlhub.pack_linear_weights(net) == 2
    assert all(type(layer) is PackedLinear for layer in (net[0], net[2]))
    with torch.no_grad():
        torch.testing.assert_close(net(x), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(net(x[:1, :1]), expected[:1, :1], atol=1e-5, rtol=1e-5)  # one row
    state = net.state_dict()
    assert state.keys() == keys.keys() and all(torch.equal(state[k], keys[k]) for k in keys)
    assert vlhub.unpack_linear_weights(net) == 2
    assert all(type(layer) is nn.Linear for layer in (net[0], net[2]))
    assert not hasattr(net[0], "_packed_weight")


def test_gradients_and_other_dtypes_take_the_plain_path():
    net, reference = small_net(), small_net()
    vlhub.pack_linear_weights(net)
    x = torch.randn(4, 12)
    net(x).square().sum().backward()
    reference(x).square().sum().backward()
    for packed, plain in zip(net.parameters(), reference.parameters()):
        assert torch.equal(packed.grad, plain.grad)  # F.linear itself when a gradient is needed
    net.double()
    with torch.no_grad():
        assert net(x.double()).dtype == torch.float64


def test_weights_changed_after_packing_are_repacked():
    net = small_net()
    vlhub.pack_linear_weights(net)
    x = torch.randn(2, 12)

    def plain(x):
        return torch.nn.functional.linear(
            net[1](torch.nn.functional.linear(x, net[0].weight, net[0].bias)), net[2].weight
        )

    with torch.no_grad():
        before = net(x)
        net[0].weight.mul_(2.0)  # in place (an optimizer step)
        changed = net(x)
        torch.testing.assert_close(changed, plain(x), atol=1e-5, rtol=1e-5)
        net[2].weight = nn.Parameter(torch.zeros(7, 20))  # replaced
        assert torch.equal(net(x), torch.zeros(2, 7))
    assert not torch.allclose(before, changed)


def test_packed_models_copy_and_pickle():
    net = small_net()
    vlhub.pack_linear_weights(net)
    x = torch.randn(2, 12)
    with torch.no_grad():
        expected = net(x)
        twin = copy.deepcopy(net)
        buffer = io.BytesIO()
        torch.save(net, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert torch.equal(twin(x), expected) and torch.equal(loaded(x), expected)


def test_context_manager_restores_the_model():
    net = small_net()
    with vlhub.packed_linear_weights(net):
        assert type(net[0]) is PackedLinear
    assert type(net[0]) is nn.Linear
    vlhub.pack_linear_weights(net)
    with vlhub.packed_linear_weights(net):
        pass
    assert type(net[0]) is PackedLinear  # packed before the block: still packed


def test_captions_are_the_same_on_packed_weights():
    torch.manual_seed(0)
    config = vlhub.TdenConfig(
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
    model = vlhub.TdenForConditionalGeneration(config).eval()
    g = torch.Generator().manual_seed(0)
    regions = dict(
        region_features=torch.rand(2, 5, 16, generator=g),
        region_locations=torch.rand(2, 5, 5, generator=g),
        region_attention_mask=torch.ones(2, 5, dtype=torch.long),
    )
    kwargs = dict(
        max_new_tokens=6,
        num_beams=3,
        length_penalty=0.0,
        do_sample=False,
        return_dict_in_generate=True,
        output_scores=True,
    )
    with torch.no_grad():
        plain = model.generate(**regions, **kwargs)
        with vlhub.packed_linear_weights(model):
            packed = model.generate(**regions, **kwargs)
    assert torch.equal(plain.sequences, packed.sequences)
    torch.testing.assert_close(torch.stack(packed.scores), torch.stack(plain.scores), atol=1e-4, rtol=1e-5)


def test_flop_counts_are_the_same_on_packed_weights():
    from torch.utils.flop_counter import FlopCounterMode

    net = small_net()
    x = torch.randn(3, 12)
    counts = []
    for pack in (False, True):
        if pack:
            vlhub.pack_linear_weights(net)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            net(x)
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] == 2 * 3 * (12 * 20 + 20 * 7)


# ------------------------------------------------------------------ what packing fuses in the BERT blocks
from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput, BertSelfOutput  # noqa: E402

from vlhub.modeling.layers import (  # noqa: E402
    PackedBertIntermediate,
    PackedBertOutput,
    PackedBertSelfOutput,
)
from vlhub.modeling.packed_linear import PackedProjectionGroup, dense_plus_residual  # noqa: E402
from vlhub.modeling.vilbert.layers_vilbert import CoAttention  # noqa: E402

from .test_vilbert_transformers_checks import text_and_regions  # noqa: E402
from .test_vilbert_transformers_checks import tiny_config as tiny_vilbert_config  # noqa: E402


def tiny_vilbert(**overrides):
    torch.manual_seed(0)
    model = vlhub.VilbertForQuestionAnswering(tiny_vilbert_config(**overrides)).eval()
    return model, text_and_regions(model.config)


def test_fused_blocks_give_the_same_outputs_and_unpack_cleanly():
    """Q/K/V as one product (BERT self-attention and both co-attention streams), GELU and the residual add inside
    the packed products: the same hidden states and logits; unpacking restores every class."""
    model, inputs = tiny_vilbert()
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    classes = [type(module) for module in model.modules()]
    with torch.no_grad():
        expected = model(**inputs, output_hidden_states=True)
        vlhub.pack_linear_weights(model)
        got = model(**inputs, output_hidden_states=True)
    switched = {type(module) for module in model.modules()}
    assert {PackedBertIntermediate, PackedBertOutput, PackedBertSelfOutput} <= switched
    assert not {BertIntermediate, BertOutput, BertSelfOutput} & switched
    co_attention = next(module for module in model.modules() if isinstance(module, CoAttention))
    groups = {co_attention.query1._projection_group, co_attention.query2._projection_group}
    assert len(groups) == 2 and all(isinstance(group, PackedProjectionGroup) for group in groups)
    assert co_attention.key2._projection_group is co_attention.query2._projection_group
    for name in ("logits", "pooler_output"):
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-5)
    for new, old in zip(
        got.hidden_states + got.vision_hidden_states, expected.hidden_states + expected.vision_hidden_states
    ):
        torch.testing.assert_close(new, old, atol=1e-5, rtol=1e-5)
    state = model.state_dict()
    assert state.keys() == keys.keys() and all(torch.equal(state[k], keys[k]) for k in keys)
    vlhub.unpack_linear_weights(model)
    assert [type(module) for module in model.modules()] == classes
    assert not any(hasattr(module, "_projection_group") for module in model.modules())


def test_a_projection_group_hands_out_only_results_of_the_same_input():
    attention = CoAttention(tiny_vilbert_config(), 8, 6, 12, 2, 0.0, 0.0).eval()
    vlhub.pack_linear_weights(attention)
    first, second = torch.randn(2, 3, 8), torch.randn(2, 3, 8)

    def plain(layer, x):
        return torch.nn.functional.linear(x, layer.weight, layer.bias)

    with torch.no_grad():
        torch.testing.assert_close(attention.value1(first), plain(attention.value1, first), atol=1e-5, rtol=1e-5)
        # the key computed with the value above is not handed out for another input ...
        torch.testing.assert_close(attention.key1(second), plain(attention.key1, second), atol=1e-5, rtol=1e-5)
        # ... nor for the same tensor changed in place since
        attention.query1(first)
        first.add_(1.0)
        torch.testing.assert_close(attention.key1(first), plain(attention.key1, first), atol=1e-5, rtol=1e-5)
        # a weight changed in place re-packs the group
        attention.value1.weight.mul_(-2.0)
        torch.testing.assert_close(attention.value1(first), plain(attention.value1, first), atol=1e-5, rtol=1e-5)
        attention.query1(first)
        attention.key1.bias.add_(3.0)  # ... and so does a bias
        torch.testing.assert_close(attention.key1(first), plain(attention.key1, first), atol=1e-5, rtol=1e-5)
    # with a gradient to compute, each layer is F.linear itself
    assert torch.equal(attention.key1(second), plain(attention.key1, second))


def test_fusions_step_aside_where_they_would_change_the_result():
    # an activation other than the exact GELU is applied as it is
    model, inputs = tiny_vilbert(hidden_act="gelu_new")
    with torch.no_grad():
        expected = model(**inputs).logits
        with vlhub.packed_linear_weights(model):
            torch.testing.assert_close(model(**inputs).logits, expected, atol=1e-5, rtol=1e-5)
    # an active dropout is applied before the residual add
    dense, dropout = nn.Linear(6, 4), nn.Dropout(0.5)
    vlhub.pack_linear_weights(dense)
    x, residual = torch.randn(3, 6), torch.randn(3, 4)
    with torch.no_grad():
        torch.manual_seed(1)
        got = dense_plus_residual(dense, dropout, x, residual)
        torch.manual_seed(1)
        expected = dropout(torch.nn.functional.linear(x, dense.weight, dense.bias)) + residual
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    assert (got == residual).any()  # some outputs were dropped


def test_fused_models_copy_pickle_and_count_the_same_flops():
    from torch.utils.flop_counter import FlopCounterMode

    model, inputs = tiny_vilbert()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        expected = model(**inputs).logits
    plain_flops = counter.get_total_flops()
    vlhub.pack_linear_weights(model)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        packed = model(**inputs).logits
    assert counter.get_total_flops() == plain_flops
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    with torch.no_grad():
        for twin in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
            torch.testing.assert_close(twin(**inputs).logits, packed, atol=0, rtol=0)
            co_attention = next(module for module in twin.modules() if isinstance(module, CoAttention))
            assert co_attention.key1._projection_group.members[0] is co_attention.query1
    torch.testing.assert_close(packed, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("min_rows", [2, 4])
def test_few_rows_run_f_linear_and_more_rows_the_packed_product(monkeypatch, min_rows):
    """Below `packed_min_rows()` rows (measured per machine: MKL's few-row kernels win there) every packed layer,
    projection group and fused block computes exactly what the plain modules compute; from there on, the packed
    product."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    from vlhub.modeling import packed_linear

    monkeypatch.setattr(packed_linear, "packed_min_rows", lambda: min_rows)
    torch.manual_seed(0)
    config = BertConfig(hidden_size=8, num_attention_heads=2, intermediate_size=16, hidden_dropout_prob=0.0)
    plain, packed = BertLayer(config).eval(), BertLayer(config).eval()
    packed.load_state_dict(plain.state_dict())
    vlhub.pack_linear_weights(packed)
    assert packed.attention.self.query._projection_group is not None  # Q/K/V grouped, GELU and residuals fused
    assert type(packed.intermediate) is PackedBertIntermediate and type(packed.output) is PackedBertOutput
    with torch.no_grad():
        for rows in (1, 2, 3, 4, 5):
            hidden = torch.randn(1, rows, 8)
            expected = plain(hidden)[0]
            with FlopCounterMode(display=False) as counter:
                got = packed(hidden)[0]
            ops = {str(op) for op in counter.get_flop_counts()["Global"]}
            if rows < min_rows:
                assert torch.equal(got, expected)
                assert not any("mkldnn" in op for op in ops)
            else:
                torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
                assert any("mkldnn" in op for op in ops)


def test_the_row_threshold_is_the_first_count_where_packed_measured_as_fast(monkeypatch):
    from vlhub.modeling import packed_linear

    for speedups, expected in (
        ({2: 1.3, 3: 1.4, 4: 1.6}, 2),  # the AVX2 EPYC's 2-row VLP steps gained from packing
        ({2: 0.87, 3: 0.85, 4: 1.6}, 4),  # the AVX512 Xeon: F.linear faster up to 3 rows
        ({2: 0.5, 3: 0.6, 4: 0.9}, packed_linear.PACKED_ROWS_EVERYWHERE),
    ):
        monkeypatch.setattr(packed_linear, "packed_speedup", speedups.__getitem__)
        packed_linear.packed_min_rows.cache_clear()
        try:
            assert packed_linear.packed_min_rows() == expected
        finally:
            packed_linear.packed_min_rows.cache_clear()
    monkeypatch.undo()  # this machine's own threshold: one of the candidates, measured once
    assert packed_linear.packed_min_rows() in (*packed_linear.PROBED_MIN_ROWS, packed_linear.PACKED_ROWS_EVERYWHERE)
    assert packed_linear.packed_min_rows.cache_info().misses <= 1


def test_the_fixed_rules_names_say_what_replaced_them():
    from vlhub.modeling import packed_linear

    with pytest.warns(FutureWarning, match="PACKED_MIN_ROWS is replaced by packed_min_rows"):
        assert packed_linear.PACKED_MIN_ROWS == packed_linear.packed_min_rows()
    with pytest.raises(AttributeError, match="ENCODER_PACKING_CPU_KINDS was removed: .*packing_pays"):
        packed_linear.ENCODER_PACKING_CPU_KINDS
    with pytest.raises(AttributeError, match="has no attribute 'NOT_A_NAME'"):
        packed_linear.NOT_A_NAME
