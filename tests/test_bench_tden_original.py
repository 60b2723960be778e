"""The TDEN decoding bench's `--original-checkout` (`bench/xmodaler_tden.py`): X-modaler's own TDENCaptioner and
decoders, built from a checkout of YehLi/xmodaler, decode the same captions as vlhub's model given its weights
through vlhub's converter, and execute exactly the FLOPs of the bench's "recompute" emulation of X-modaler.

Needs a checkout of X-modaler (never shipped with vlhub): set VLHUB_XMODALER_CHECKOUT to its path, e.g. after
`git clone https://github.com/YehLi/xmodaler`. Without it the comparison is skipped."""

import os
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vlhub import TdenForConditionalGeneration

from .test_bench_tden_recompute import load_bench, tiny_config

CHECKOUT = os.environ.get("VLHUB_XMODALER_CHECKOUT")
CONFIG = "configs/image_caption/tden/tden.yaml"


def test_a_folder_that_is_not_an_xmodaler_checkout_is_refused(tmp_path):
    load_bench()  # puts bench/ on sys.path
    import xmodaler_tden

    with pytest.raises(FileNotFoundError, match="not a checkout of X-modaler.*tden.yaml"):
        xmodaler_tden.build_original(tmp_path, tiny_config(), steps=4)


NOT_A_CHECKOUT = str(Path(__file__).parent)


@pytest.mark.parametrize(
    "arguments, error",
    [
        (["--profile-original"], "--profile-original needs --original-checkout"),
        (["--original-checkout", NOT_A_CHECKOUT], "not a checkout of YehLi/xmodaler"),
    ],
)
def test_the_bench_refuses_a_profile_without_checkout_and_a_folder_that_is_not_one(
    monkeypatch, capsys, arguments, error
):
    bench = load_bench()
    monkeypatch.setattr(sys, "argv", ["bench_tden_decoding.py", *arguments])
    with pytest.raises(SystemExit):
        bench.main()
    assert error in capsys.readouterr().err


@pytest.mark.skipif(
    not CHECKOUT or not (Path(CHECKOUT) / CONFIG).is_file(),
    reason="set VLHUB_XMODALER_CHECKOUT to a checkout of github.com/YehLi/xmodaler",
)
def test_original_code_decodes_the_same_captions_with_the_recompute_flops():
    bench = load_bench()
    import xmodaler_tden

    torch.manual_seed(0)
    config = tiny_config()
    batch, regions, steps = 2, 5, 6
    original = xmodaler_tden.build_original(CHECKOUT, config, steps)
    assert type(original).__name__ == "TDENCaptioner" and not original.training
    xmodaler_tden.suppress_eos(original, config.eos_token_id)
    model = TdenForConditionalGeneration(config).eval()
    xmodaler_tden.copy_original_weights(original, model)
    inputs = bench.inputs(model, batch, regions, "cpu")
    original_batch = xmodaler_tden.original_inputs(original, inputs, steps)
    for beams in (1, 3):
        with torch.no_grad():
            with FlopCounterMode(display=False) as original_flops:
                ids = xmodaler_tden.decode_original(original, original_batch, beams)
            with FlopCounterMode(display=False) as recompute_flops:
                recomputed = bench.run(model, inputs, beams, steps, "recompute")
            cached = bench.run(model, inputs, beams, steps, "cache")
        assert ids.shape == (batch, steps)
        assert torch.equal(cached[:, 1:], ids) and torch.equal(recomputed, cached)
        assert original_flops.get_total_flops() == recompute_flops.get_total_flops()
        if beams > 1:
            with torch.no_grad():
                assert torch.equal(bench.run(model, inputs, beams, steps, "xmodaler"), ids)
        assert not ids.eq(config.eos_token_id).any()  # EOS suppressed: every row decodes every step
