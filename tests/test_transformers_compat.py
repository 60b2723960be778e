"""The key/value cache across the supported transformers versions (5.24 renamed `past_key_values` to `cache`):
vlhub's forwards take either name, generation runs without transformers' deprecation notices, and
`vlhub.utils.compat.CACHE_NAME` matches the installed version."""

import logging
import warnings

import pytest
import torch
import transformers
from packaging import version
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.utils import logging as hf_logging

from vlhub import TdenForConditionalGeneration
from vlhub.modeling.tden import xmodaler_beam_search
from vlhub.modeling.unified_vlp import vlp_beam_search
from vlhub.utils.compat import CACHE_NAME, accepts_past_key_values

from .test_tden_modeling import inputs, regions, tiny_config
from .test_unified_vlp_modeling import UnifiedVlpForConditionalGeneration, make_regions, model_of, processor  # noqa: F401


def test_cache_name_is_the_installed_transformers_name():
    renamed = version.parse(transformers.__version__).release >= (5, 24)
    assert CACHE_NAME == ("cache" if renamed else "past_key_values")


def test_forwards_take_the_cache_under_either_name_but_not_both():
    torch.manual_seed(0)
    model = TdenForConditionalGeneration(tiny_config(num_cross_encoder_layers=0)).eval()
    batch = inputs()
    start = torch.full((2, 1), model.config.bos_token_id)
    new_cache, old_cache = (EncoderDecoderCache(DynamicCache(), DynamicCache()) for _ in range(2))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old name warns: the next test checks it
        model(input_ids=start, cache=new_cache, use_cache=True, **regions(batch))
        model(input_ids=start, past_key_values=old_cache, use_cache=True, **regions(batch))
        assert new_cache.get_seq_length() == old_cache.get_seq_length() == 1
        step = torch.tensor([[5], [7]])
        mask = {"region_attention_mask": batch["region_attention_mask"]}
        by_new = model(input_ids=step, cache=new_cache, use_cache=True, **mask).logits
        by_old = model(input_ids=step, past_key_values=old_cache, use_cache=True, **mask).logits
    torch.testing.assert_close(by_new, by_old, atol=0, rtol=0)
    with pytest.raises(ValueError, match="`cache` and as `past_key_values`"):
        model(input_ids=step, cache=new_cache, past_key_values=old_cache, **mask)


def test_the_legacy_keyword_reaches_the_forward_as_cache():
    @accepts_past_key_values
    def forward(x, cache=None):
        return cache

    marker = object()
    renamed = CACHE_NAME == "cache"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert forward(1, past_key_values=marker) is marker
        assert forward(1, cache=marker, past_key_values=None) is marker
        assert forward(1) is None
    # From 5.24 on, transformers' models warn on each use of the old name (`deprecate_kwarg`); so does vlhub.
    deprecations = [w for w in caught if "`past_key_values` is deprecated" in str(w.message)]
    assert [w.category for w in deprecations] == ([FutureWarning] if renamed else [])


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_generation_raises_no_cache_deprecation_notice(processor):  # noqa: F811 (the imported pytest fixture)
    """transformers 5.24 warns (FutureWarning, or its logger once) where the old name `past_key_values` is used."""
    records = _Records()
    hf_logging.warning_once.cache_clear()  # notices already shown by earlier tests would otherwise be skipped
    hf_logging.get_logger().addHandler(records)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("error", FutureWarning)
            torch.manual_seed(0)
            tden = TdenForConditionalGeneration(tiny_config()).eval()
            batch = inputs()
            for settings in (dict(do_sample=False), dict(num_beams=2, do_sample=False), dict(do_sample=True)):
                tden.generate(**regions(batch), max_new_tokens=3, **settings)
            tden.generate(**regions(batch), max_new_tokens=3, num_beams=2, custom_generate=xmodaler_beam_search)
            vlp = model_of(UnifiedVlpForConditionalGeneration)
            prompt = processor(regions=[make_regions(4), make_regions(3, 1)])
            vlp.generate(**prompt, max_new_tokens=3, do_sample=False)
            vlp.generate(**prompt, max_new_tokens=3, num_beams=2, do_sample=False)
            vlp.generate(**prompt, max_new_tokens=3, num_beams=2, custom_generate=vlp_beam_search)
    finally:
        hf_logging.get_logger().removeHandler(records)
    assert not [message for message in records.messages if "deprecated" in message], records.messages
