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
        return torch.nn.functional.linear(net[1](torch.nn.functional.linear(x, net[0].weight, net[0].bias)),
                                          net[2].weight)

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
    config = vlhub.TdenConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_visual_layers=2,
                              num_cross_encoder_layers=0, num_decoder_layers=2, num_attention_heads=4,
                              intermediate_size=48, max_position_embeddings=24, region_feature_dim=16,
                              bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = vlhub.TdenForConditionalGeneration(config).eval()
    g = torch.Generator().manual_seed(0)
    regions = dict(region_features=torch.rand(2, 5, 16, generator=g), region_locations=torch.rand(2, 5, 5, generator=g),
                   region_attention_mask=torch.ones(2, 5, dtype=torch.long))
    kwargs = dict(max_new_tokens=6, num_beams=3, length_penalty=0.0, do_sample=False, return_dict_in_generate=True,
                  output_scores=True)
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
