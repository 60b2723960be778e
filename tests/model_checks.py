"""What transformers checks for its own models, for any vlhub model class.

Use: describe each model with a `ModelCase` (class, tiny config, input builder, label builder) and subclass
`ModelChecks` in a test module that provides a `case` fixture:

    CASES = [ModelCase("vqa", UniterForQuestionAnswering, tiny_config, build_inputs, labels=vqa_labels), ...]

    case = model_case_fixture(CASES)

    class TestMyModels(ModelChecks):
        pass

Every check is generic: inputs come from the case's builders, outputs are compared field by field (every tensor of
the `ModelOutput`), and parameter names appear only in a case's `unused_parameters`.
"""

import copy
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from unittest import mock

import pytest
import torch
import transformers

from vlhub.modeling.packed_linear import PackedLinear, packed_linear_available, packed_linear_weights

__all__ = ["ModelCase", "ModelChecks", "output_tensors", "assert_outputs_close", "model_case_fixture"]


@dataclass
class ModelCase:
    """One model class under test.

    Args:
        name: test id.
        model_class: the `PreTrainedModel` subclass.
        config: a tiny config (it is deep-copied for every model built; dropout is set to 0 so runs compare).
        inputs: `inputs(config) -> dict` of model inputs without labels (deterministic), including the text input.
        labels: `labels(config, inputs) -> dict` of extra arguments making `outputs.loss` defined; `None` for a model
            without a loss (the checks then use `loss_from_outputs`).
        unused_parameters: regexes of parameter names that legitimately get no gradient in this case (e.g. the
            heads of the other pre-training objectives). Everything else must get a gradient.
        text_input: name of the token-id input that `inputs_embeds` replaces.
        forward_kwargs: extra keyword arguments of every call (e.g. `objective=`).
        num_returned_layers: how many layers' hidden states and attentions the model returns, where it runs fewer
            than `config.num_hidden_layers` (a head that builds only part of a stream).
    """

    name: str
    model_class: type
    config: object
    inputs: Callable[[object], dict]
    labels: Callable[[object, dict], dict] | None = None
    unused_parameters: tuple[str, ...] = ()
    text_input: str = "input_ids"
    forward_kwargs: dict = field(default_factory=dict)
    num_returned_layers: int | None = None

    def make_config(self, **overrides):
        config = copy.deepcopy(self.config)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if hasattr(config, name):
                setattr(config, name, 0.0)
        for name, value in overrides.items():
            setattr(config, name, value)
        return config

    def build(self, seed: int = 0, **config_overrides):
        torch.manual_seed(seed)
        return self.model_class(self.make_config(**config_overrides))

    def call(self, model, inputs, with_labels: bool = False, **kwargs):
        extra = self.labels(model.config, inputs) if with_labels and self.labels is not None else {}
        return model(**inputs, **extra, **self.forward_kwargs, **kwargs)


def output_tensors(outputs) -> dict[str, torch.Tensor]:
    """Every tensor of a `ModelOutput`, flattened: `{"logits": t, "hidden_states.0": t, ...}`."""
    found = {}
    for key, value in outputs.items():
        if isinstance(value, torch.Tensor):
            found[key] = value
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                if isinstance(item, torch.Tensor):
                    found[f"{key}.{i}"] = item
    return found


def assert_outputs_close(actual, expected, atol: float = 0.0, what: str = ""):
    a, b = output_tensors(actual), output_tensors(expected)
    assert a.keys() == b.keys(), f"{what}: output fields differ: {sorted(a)} vs {sorted(b)}"
    assert a, f"{what}: no tensor outputs to compare"
    for key in a:
        assert a[key].shape == b[key].shape, f"{what}: {key} shape {tuple(a[key].shape)} != {tuple(b[key].shape)}"
        if atol == 0:
            assert torch.equal(a[key], b[key]), f"{what}: {key} differs"
        else:
            diff = (a[key].float() - b[key].float()).abs().max().item()
            assert diff <= atol, f"{what}: {key} differs by {diff:.3g} > {atol}"


def loss_from_outputs(outputs) -> torch.Tensor:
    """The case's loss, or for a model without one the sum of its floating outputs (reaches every parameter)."""
    if getattr(outputs, "loss", None) is not None:
        return outputs.loss
    return sum(t.float().sum() for t in output_tensors(outputs).values() if t.is_floating_point())


def _gradients(case: ModelCase, model, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    model.zero_grad(set_to_none=True)
    loss = loss_from_outputs(case.call(model, inputs, with_labels=True))
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def _count_sdpa_calls(case: ModelCase, model, inputs) -> int:
    original = torch.nn.functional.scaled_dot_product_attention
    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", wraps=original) as spy:
        with torch.no_grad():
            case.call(model, inputs)
    return spy.call_count


_SYNC_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
# Syncs inside these packages are not the model's own (e.g. transformers' mask creation checks `padding_mask.all()`
# to skip the mask for SDPA, in BERT too).
_LIBRARY_ROOTS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, transformers))


def _forbid_host_sync_in_model_code():
    """Patch the Tensor methods that copy a value to the host so that a call from outside torch/transformers fails.
    (Data-dependent shapes, e.g. boolean-mask gathers, also sync on an accelerator but are not seen here.)"""
    patches = []
    for name in _SYNC_METHODS:
        original = getattr(torch.Tensor, name)

        def guarded(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1)
            if not caller.f_code.co_filename.startswith(_LIBRARY_ROOTS):
                raise AssertionError(
                    f"host-device sync in forward: Tensor.{_name}() at {caller.f_code.co_filename}:{caller.f_lineno}"
                )
            return _original(self, *args, **kwargs)

        patches.append(mock.patch.object(torch.Tensor, name, guarded))
    return patches


class ModelChecks:
    """The checks; a subclass's module provides the `case` fixture (a `ModelCase`)."""

    atol = 1e-5

    def test_save_load_round_trip(self, case, tmp_path):
        model = case.build().eval()
        inputs = case.inputs(model.config)
        model.save_pretrained(tmp_path)
        loaded, info = case.model_class.from_pretrained(tmp_path, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
        loaded.eval()
        with torch.no_grad():
            # Same weights; BLAS may pick another kernel for differently aligned (memory-mapped) tensors.
            assert_outputs_close(case.call(loaded, inputs), case.call(model, inputs), 1e-6, "reloaded")

    def test_every_parameter_gets_a_finite_gradient(self, case):
        model = case.build().train()
        _, grads = _gradients(case, model, case.inputs(model.config))
        unused = [re.compile(p) for p in case.unused_parameters]
        missing, not_finite = [], []
        for name, grad in grads.items():
            if any(p.search(name) for p in unused):
                continue
            if grad is None:
                missing.append(name)
            elif not torch.isfinite(grad).all():
                not_finite.append(name)
        assert not missing, f"parameters without gradient (unused by this head's forward): {missing}"
        assert not not_finite, f"parameters with non-finite gradient: {not_finite}"

    def test_forward_makes_no_host_device_sync(self, case):
        model = case.build().train()
        inputs = case.inputs(model.config)
        labels = case.labels(model.config, inputs) if case.labels is not None else {}
        patches = _forbid_host_sync_in_model_code()
        for patch in patches:
            patch.start()
        try:
            model(**inputs, **labels, **case.forward_kwargs)
        finally:
            for patch in patches:
                patch.stop()

    def test_hidden_states_and_attentions(self, case):
        model = case.build(_attn_implementation="eager").eval()
        config = model.config
        with torch.no_grad():
            outputs = case.call(model, case.inputs(config), output_hidden_states=True, output_attentions=True)
        hidden_states, attentions = outputs.hidden_states, outputs.attentions
        layers = config.num_hidden_layers if case.num_returned_layers is None else case.num_returned_layers
        assert hidden_states is not None and len(hidden_states) == layers + 1
        assert attentions is not None and len(attentions) == layers
        sequences, length, hidden = hidden_states[0].shape
        assert hidden == config.hidden_size
        assert all(h.shape == (sequences, length, hidden) for h in hidden_states)
        assert all(a.shape == (sequences, config.num_attention_heads, length, length) for a in attentions)
        if getattr(outputs, "last_hidden_state", None) is not None:
            assert torch.equal(outputs.last_hidden_state, hidden_states[-1])
        without = case.call(model, case.inputs(config))
        assert without.hidden_states is None and without.attentions is None

    def test_eager_matches_sdpa(self, case):
        eager = case.build(_attn_implementation="eager").eval()
        sdpa = case.build(seed=1, _attn_implementation="sdpa").eval()
        sdpa.load_state_dict(eager.state_dict())
        assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
        inputs = case.inputs(eager.config)
        with torch.no_grad():
            assert_outputs_close(case.call(sdpa, inputs), case.call(eager, inputs), self.atol, "sdpa vs eager")

    def test_packed_inference_matches_and_unpacks(self, case):
        """`vlhub.pack_linear_weights` (oneDNN-packed weights, fused Q/K/V, GELU and residual adds): the same outputs
        with hidden states, the same parameters, and every module's class restored by unpacking."""
        if not packed_linear_available():
            pytest.skip("this torch build has no oneDNN")
        model = case.build().eval()
        inputs = case.inputs(model.config)
        classes = [type(module) for module in model.modules()]
        state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        with torch.no_grad():
            expected = case.call(model, inputs, output_hidden_states=True)
            with packed_linear_weights(model):
                assert any(type(module) is PackedLinear for module in model.modules())
                packed = case.call(model, inputs, output_hidden_states=True)
                again = case.call(model, inputs, output_hidden_states=True)  # packed copies made on first use
        assert_outputs_close(packed, expected, self.atol, "packed")
        assert_outputs_close(again, packed, 0.0, "packed, second call")
        assert [type(module) for module in model.modules()] == classes
        assert all(torch.equal(tensor, state[name]) for name, tensor in model.state_dict().items())

    def test_set_attn_implementation_switches_both_ways(self, case):
        model = case.build(_attn_implementation="sdpa").eval()
        inputs = case.inputs(model.config)
        with torch.no_grad():
            reference = case.call(model, inputs)
        sdpa_calls = _count_sdpa_calls(case, model, inputs)
        assert sdpa_calls > 0
        model.set_attn_implementation("eager")
        assert model.config._attn_implementation == "eager"
        assert all(m.config._attn_implementation == "eager" for m in model.modules() if hasattr(m, "config"))
        assert _count_sdpa_calls(case, model, inputs) < sdpa_calls, "the encoder still runs SDPA after switching"
        with torch.no_grad():
            assert_outputs_close(case.call(model, inputs), reference, self.atol, "after switching to eager")
        model.set_attn_implementation("sdpa")
        assert model.config._attn_implementation == "sdpa"
        assert _count_sdpa_calls(case, model, inputs) == sdpa_calls
        with torch.no_grad():
            assert_outputs_close(case.call(model, inputs), reference, self.atol, "after switching back to sdpa")

    def test_inputs_embeds_matches_input_ids(self, case):
        model = case.build().eval()
        inputs = case.inputs(model.config)
        ids = inputs[case.text_input]
        embedded = {k: v for k, v in inputs.items() if k != case.text_input}
        with torch.no_grad():
            embedded["inputs_embeds"] = model.get_input_embeddings()(ids)
            assert_outputs_close(case.call(model, embedded), case.call(model, inputs), 1e-6, "inputs_embeds")

    def test_resize_token_embeddings(self, case):
        model = case.build().eval()
        inputs = case.inputs(model.config)
        old = model.config.vocab_size
        new = old + 7
        model.resize_token_embeddings(new)
        assert model.config.vocab_size == new
        assert model.get_input_embeddings().weight.shape[0] == new
        output_embeddings = model.get_output_embeddings()
        if output_embeddings is not None:
            assert output_embeddings.weight.shape[0] == new
            if getattr(output_embeddings, "bias", None) is not None:
                assert output_embeddings.bias.shape == (new,)
            if model.config.tie_word_embeddings:
                assert output_embeddings.weight is model.get_input_embeddings().weight
        inputs[case.text_input] = inputs[case.text_input].clone()
        inputs[case.text_input][..., 1] = new - 1  # a new token
        with torch.no_grad():
            outputs = case.call(model, inputs, with_labels=True)
        assert all(torch.isfinite(t).all() for t in output_tensors(outputs).values() if t.is_floating_point())

    def test_gradient_checkpointing_gives_the_same_loss_and_gradients(self, case):
        plain = case.build().train()
        inputs = case.inputs(plain.config)
        loss, grads = _gradients(case, plain, inputs)
        checkpointed = case.build().train()
        checkpointed.load_state_dict(plain.state_dict())
        # transformers 5.23 renames gradient_checkpointing_enable (deprecated, same behaviour) to
        # activation_checkpointing_enable.
        enable = (
            getattr(checkpointed, "activation_checkpointing_enable", None) or checkpointed.gradient_checkpointing_enable
        )
        enable()
        assert any(getattr(m, "gradient_checkpointing", False) for m in checkpointed.modules())
        loss_ckpt, grads_ckpt = _gradients(case, checkpointed, inputs)
        assert torch.allclose(loss, loss_ckpt, atol=1e-6), (loss, loss_ckpt)
        assert grads.keys() == grads_ckpt.keys()
        for name, grad in grads.items():
            if grad is None:
                assert grads_ckpt[name] is None, name
            else:
                torch.testing.assert_close(grads_ckpt[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def model_case_fixture(cases):
    """The `case` fixture `ModelChecks` needs: one test per `ModelCase`, named by the case."""
    import pytest

    @pytest.fixture(params=cases, ids=lambda case: case.name)
    def case(request):
        return request.param

    return case
