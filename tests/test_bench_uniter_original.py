"""The encoder bench's UNITER case with `--original-checkout` (`bench/encoders/uniter.py`): the original
`UniterForVisualQuestionAnswering`, built from a checkout of ChenRocks/UNITER, gives the answer scores of vlhub's
model once its weights went through vlhub's converter, on the bench's own examples.

Needs a checkout of the original code (never shipped with vlhub): set VLHUB_UNITER_CHECKOUT to its path, e.g. after
`git clone https://github.com/ChenRocks/UNITER`. Without it the comparison is skipped."""

import os
import sys
from pathlib import Path

import pytest
import torch

import vlhub
from vlhub.registry import get_architecture

CHECKOUT = os.environ.get("VLHUB_UNITER_CHECKOUT")
BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.skipif(
    not CHECKOUT or not (Path(CHECKOUT) / "model" / "vqa.py").is_file(),
    reason="set VLHUB_UNITER_CHECKOUT to a checkout of github.com/ChenRocks/UNITER",
)
def test_the_original_vqa_model_gives_vlhubs_scores(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from encoders import uniter as case

    torch.manual_seed(0)
    tiny = get_architecture("uniter").config_presets["tiny"]
    config = vlhub.UniterConfig(**tiny, vocab_size=1200, region_feature_dim=48, id2label={i: str(i) for i in range(10)})
    original = case.build_original(CHECKOUT, config)
    assert type(original.net).__name__ == "UniterForVisualQuestionAnswering" and not original.training
    model = vlhub.UniterForQuestionAnswering(config).eval()
    case.copy_original_weights(original, model)
    with torch.no_grad():
        expected = original(**case.make_original_inputs(original, 3, 9, 5))
        got = model(**case.make_inputs(model, 3, 9, 5)).logits
    assert expected.shape == got.shape == (3, 10)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert "apex" not in sys.modules or hasattr(sys.modules["apex"], "__file__")  # the stand-in did not stay behind
