"""What the `ModelOutput`s of vlhub's task heads share.

A head passes on the per-layer records of its base model's output (hidden states and attention maps of each stream
it runs, as transformers' multi-stream heads do: LXMERT's). `layer_records` declares those fields once: the base
model's output documents each record, and a head's output names the records it carries.
"""

import inspect
from collections.abc import Callable
from dataclasses import fields

import torch
from transformers.modeling_outputs import ModelOutput

__all__ = ["layer_records", "passed_records"]


def _record_flag(name: str) -> str:
    """The `output_*` flag that asks for a record: attention maps or hidden states, told by the field's name."""
    if name.endswith("attentions"):
        return "output_attentions"
    if name.endswith("hidden_states"):
        return "output_hidden_states"
    raise ValueError(f"{name!r} is not a per-layer record (a name ending in 'hidden_states' or 'attentions')")


def layer_records(
    source: type[ModelOutput], *names: str, note: str = "", after: str | None = None
) -> Callable[[type], type]:
    """Class decorator, placed under `@dataclass`, for a head's `ModelOutput` that passes on the per-layer records
    `names` of its base model's output class `source`.

    Each record becomes a field `tuple[torch.FloatTensor, ...] | None = None` after the class's own fields (so those
    keep the first tuple positions), or right after its own field `after` where the output's public tuple positions
    put the records there, in the order given, documented as "As `Source.name`" followed by `note` (e.g. ", one row
    per (example, choice)"), for `@auto_docstring` above to render with the rest. The names are also kept in the
    class attribute `record_fields`, for the head's forward to copy them from the base model's output
    (`passed_records`). A name that is not a field of `source`, or that the class declares itself, or an `after` it
    does not declare, is a `TypeError` at import.
    """
    source_fields = {field.name for field in fields(source)}
    unknown = [name for name in names if name not in source_fields]
    if unknown:
        raise TypeError(f"{source.__name__} has no records {unknown} to pass on")
    flags = {name: _record_flag(name) for name in names}

    def add_records(output_class: type) -> type:
        annotations = dict(output_class.__dict__.get("__annotations__", {}))
        declared = [name for name in names if name in annotations]
        if declared:
            raise TypeError(f"{output_class.__name__} declares {declared} itself; name them in layer_records only")
        own = list(annotations)
        if after is not None and after not in own:
            raise TypeError(f"{output_class.__name__} has no field {after!r} to place its records after")
        place = own.index(after) + 1 if after is not None else len(own)
        record_type = tuple[torch.FloatTensor, ...] | None
        ordered = [*own[:place], *names, *own[place:]]
        output_class.__annotations__ = {name: annotations.get(name, record_type) for name in ordered}
        for name in names:
            setattr(output_class, name, None)
        output_class.record_fields = names
        documented = "".join(
            f"{name} (`tuple(torch.FloatTensor)`, *optional*, returned with `{flags[name]}=True`):\n"
            f"    As `{source.__name__}.{name}`{note}.\n"
            for name in names
        )
        output_class.__doc__ = inspect.cleandoc(output_class.__doc__ or "") + "\n" + documented
        return output_class

    return add_records


def passed_records(output_class: type[ModelOutput], outputs: ModelOutput) -> dict[str, tuple | None]:
    """The per-layer records of the base model's `outputs` that a head's `output_class` (decorated with
    `layer_records`) passes on, by name (`None` where `outputs` holds none)."""
    return {name: outputs.get(name) for name in output_class.record_fields}
