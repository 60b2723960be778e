"""What differs between the transformers versions vlhub supports (`setup.py`: 5.17 to 5.24), in one place.

transformers 5.24 renamed the key/value cache of generation from `past_key_values` to `cache`: the keyword of every
forward, layer and mask function (`create_causal_mask`, `BertEncoder`, `BertAttention`, ...), the field of every
`ModelOutput` that carries one, and the name under which `GenerationMixin` passes it to `forward` and reads it back
from the output. The old name still works in 5.24 but warns (deprecated until 5.40); before 5.24 the new one does not
exist. So that one code path runs on every supported version:

- vlhub's own forwards and output classes name the cache `cache` (the name from 5.24 on); `accepts_past_key_values`
  lets those forwards also take `past_key_values=`, which is what `generate()` passes before 5.24;
- calls into transformers (its BERT blocks and mask functions) and transformers' own output classes get the cache
  as `**cache_argument(cache)`, under the name of the installed version (no deprecation warning on 5.24);
- `CACHE_NAME` is that name, e.g. the key of the cache in `generate()`'s `model_kwargs` and in transformers' outputs.

When the lowest supported transformers is 5.24 or later: write `cache=x` for `**cache_argument(x)` and `"cache"` for
`CACHE_NAME`, drop `accepts_past_key_values`.

transformers 5.20 gave pipelines `Pipeline._prepare_generate_kwargs` (merging a call's generation settings with those
given to `pipeline()` and the pipeline's defaults); `pipeline_generate_kwargs` falls back to what transformers' own
pipelines did before (the pipeline's `generation_config`). Drop it when the lowest supported version is 5.20.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from transformers.modeling_outputs import CausalLMOutputWithPast

if TYPE_CHECKING:
    from transformers import Cache, Pipeline

_Returned = TypeVar("_Returned")

__all__ = ["CACHE_NAME", "cache_argument", "accepts_past_key_values", "pipeline_generate_kwargs"]

#: The installed transformers' name for the key/value cache: "cache" from 5.24 on, "past_key_values" before.
CACHE_NAME = (
    "cache" if any(field.name == "cache" for field in dataclasses.fields(CausalLMOutputWithPast)) else "past_key_values"
)


def cache_argument(cache: Cache | None) -> dict:
    """`{CACHE_NAME: cache}`: keyword arguments that hand `cache` (a `Cache` or None) to a transformers function, module
    or output class of the installed version under the name it expects."""
    return {CACHE_NAME: cache}


def accepts_past_key_values(forward: Callable[..., _Returned]) -> Callable[..., _Returned]:
    """Decorate a vlhub `forward` whose cache parameter is `cache` so that it also takes the cache as
    `past_key_values=` (what `generate()` passes before transformers 5.24, and what code written for those versions
    says). Given both, it raises; from 5.24 on the old name warns (`FutureWarning`), as transformers' models do."""

    @functools.wraps(forward)
    def forward_taking_either_name(*args: Any, **kwargs: Any) -> _Returned:
        if "past_key_values" in kwargs:
            legacy = kwargs.pop("past_key_values")
            if kwargs.get("cache") is not None:
                if legacy is not None:
                    raise ValueError(
                        "the key/value cache was given twice, as `cache` and as `past_key_values`: "
                        "pass it as `cache` only"
                    )
            else:
                if CACHE_NAME == "cache":
                    # transformers' own models warn on every such call (`deprecate_kwarg`), with this wording
                    warnings.warn(
                        f"`past_key_values` is deprecated and will be removed in version 5.40.0 for "
                        f"`{forward.__qualname__}`. Use `cache` instead.",
                        FutureWarning,
                        stacklevel=2,
                    )
                kwargs["cache"] = legacy
        return forward(*args, **kwargs)

    return forward_taking_either_name


def pipeline_generate_kwargs(pipeline: Pipeline, generate_kwargs: dict) -> dict:
    """The `generate()` keyword arguments of one call of a generating `pipeline`: the call's settings over those given
    to `pipeline()` over the pipeline's defaults (`_default_generation_config`). transformers' own merge from 5.20 on;
    before, the call's settings over the pipeline's `generation_config`, which holds the other two (as transformers'
    pipelines of those versions pass it)."""
    prepare = getattr(pipeline, "_prepare_generate_kwargs", None)
    if prepare is not None:
        return prepare(generate_kwargs)
    if "generation_config" in generate_kwargs:
        return dict(generate_kwargs)
    return {"generation_config": pipeline.generation_config, **generate_kwargs}
