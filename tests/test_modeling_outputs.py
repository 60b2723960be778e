"""`layer_records`: the per-layer record fields a head's output passes on, declared once. The tuple positions of the
outputs that use it are public: pinned here as they were when the fields were written out by hand."""

from dataclasses import dataclass, fields

import pytest
import torch
from transformers.modeling_outputs import ModelOutput
from transformers.utils import auto_docstring

from vlhub.modeling.modeling_outputs import layer_records
from vlhub.modeling.tden import modeling_tden
from vlhub.modeling.unified_vlp import modeling_unified_vlp
from vlhub.modeling.uniter import modeling_uniter
from vlhub.modeling.vilbert import modeling_vilbert
from vlhub.modeling.vl_bert import modeling_vl_bert

TDEN_STREAMS = [
    "hidden_states",
    "attentions",
    "vision_hidden_states",
    "vision_attentions",
    "cross_encoder_hidden_states",
    "cross_encoder_attentions",
    "decoder_hidden_states",
    "decoder_attentions",
    "decoder_cross_attentions",
]
VILBERT_RECORDS = [
    "hidden_states",
    "attentions",
    "vision_hidden_states",
    "vision_attentions",
    "text_to_vision_attentions",
    "vision_to_text_attentions",
]
FIELD_ORDER = {
    modeling_tden.TdenForPreTrainingOutput: [
        *("loss", "mlm_loss", "moc_loss", "msg_loss", "ism_loss", "mlm_logits", "msg_logits", "moc_logits"),
        *("similarity", "text_embeds", "image_embeds", "hidden_states", "attentions", "generation_hidden_states"),
        "generation_attentions",
        *TDEN_STREAMS[2:],
    ],
    modeling_tden.TdenCaptioningOutput: [
        *("loss", "logits", "cache", "hidden_states", "attentions", "decoder_hidden_states", "vision_hidden_states"),
        *("vision_attentions", "decoder_attentions", "decoder_cross_attentions"),
    ],
    modeling_tden.TdenQuestionAnsweringOutput: [
        *("loss", "logits", "understanding_logits", "generation_logits"),
        *TDEN_STREAMS,
    ],
    modeling_tden.TdenRetrievalOutput: [
        *("loss", "logits", "logits_per_text", "logits_per_image", "text_embeds", "image_embeds"),
        *TDEN_STREAMS[:4],
    ],
    modeling_tden.TdenMultipleChoiceOutput: ["loss", "logits", *TDEN_STREAMS],
    modeling_vilbert.VilbertForPreTrainingOutput: [
        *("loss", "mlm_loss", "region_kl_loss", "alignment_loss", "prediction_logits", "mlm_logits"),
        *("region_logits", "alignment_logits", "pooler_output"),
        *VILBERT_RECORDS,
    ],
    modeling_vilbert.VilbertClassifierOutput: ["loss", "logits", "pooler_output", *VILBERT_RECORDS],
    modeling_uniter.UniterForPreTrainingOutput: [
        *("loss", "mlm_loss", "mrfr_loss", "mrc_loss", "mrc_kl_loss", "itm_loss", "wra_loss", "itc_loss"),
        *("mlm_logits", "mrfr_predictions", "mrc_logits", "itm_logits", "wra_distance", "itc_logits"),
        *("last_hidden_state", "pooler_output", "hidden_states", "attentions"),
    ],
    modeling_vl_bert.VlBertForPreTrainingOutput: [
        *("loss", "mlm_loss", "text_only_mlm_loss", "mvrc_loss", "mlm_logits", "mvrc_logits"),
        *("last_hidden_state", "hidden_states", "attentions"),
    ],
    modeling_vl_bert.VlBertClassifierOutput: ["loss", "logits", "last_hidden_state", "hidden_states", "attentions"],
    modeling_unified_vlp.UnifiedVlpForPreTrainingOutput: [
        *("loss", "logits", "last_hidden_state", "hidden_states", "attentions"),
        *("s2s_loss", "bi_loss", "mlm_loss", "mlm_logits"),
    ],
}
# The base model output each architecture's heads pass the records of.
RECORD_SOURCE = {
    modeling_tden.__name__: "TdenModelOutput",
    modeling_vilbert.__name__: "VilbertModelOutput",
    modeling_uniter.__name__: "BaseModelOutputWithPooling",
    modeling_vl_bert.__name__: "VlBertModelOutput",
    modeling_unified_vlp.__name__: "BaseModelOutputWithPoolingAndCrossAttentions",
}


@pytest.mark.parametrize("output_class", FIELD_ORDER, ids=lambda output_class: output_class.__name__)
def test_record_fields_follow_the_own_fields_at_their_public_positions(output_class):
    assert [field.name for field in fields(output_class)] == FIELD_ORDER[output_class]
    source = RECORD_SOURCE[output_class.__module__]
    for name in output_class.record_fields:
        assert f"{name} (`tuple(torch.FloatTensor)`, *optional*" in output_class.__doc__, name
        assert f"As `{source}.{name}`" in output_class.__doc__, name


@dataclass
class _Base(ModelOutput):
    r"""
    last_hidden_state (`torch.FloatTensor` of shape `(batch, length, hidden)`):
        The output.
    hidden_states (`tuple(torch.FloatTensor)`, *optional*):
        Every layer's output.
    attentions (`tuple(torch.FloatTensor)`, *optional*):
        Every layer's attention map.
    """

    last_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


def test_a_head_output_gets_the_records_after_its_own_fields_documented_and_in_its_tuple():
    @auto_docstring
    @dataclass
    @layer_records(_Base, "attentions", "hidden_states", note=", one row per pair")
    class HeadOutput(ModelOutput):
        r"""
        logits (`torch.FloatTensor` of shape `(batch, 2)`):
            The scores.
        """

        logits: torch.FloatTensor | None = None

    assert [field.name for field in fields(HeadOutput)] == ["logits", "attentions", "hidden_states"]
    assert HeadOutput.record_fields == ("attentions", "hidden_states")
    assert "returned with `output_attentions=True`" in HeadOutput.__doc__
    assert "returned with `output_hidden_states=True`" in HeadOutput.__doc__
    assert "As `_Base.hidden_states`, one row per pair." in HeadOutput.__doc__
    logits, maps = torch.zeros(1, 2), (torch.ones(1),)
    assert HeadOutput(logits=logits, attentions=maps).to_tuple() == (logits, maps)


def test_records_can_stand_after_a_named_own_field_where_the_public_positions_put_them():
    @dataclass
    @layer_records(_Base, "hidden_states", after="logits")
    class HeadOutput(ModelOutput):
        loss: torch.FloatTensor | None = None
        logits: torch.FloatTensor | None = None
        extra_loss: torch.FloatTensor | None = None

    assert [field.name for field in fields(HeadOutput)] == ["loss", "logits", "hidden_states", "extra_loss"]

    class Scores(ModelOutput):
        logits: torch.FloatTensor | None = None

    with pytest.raises(TypeError, match="no field 'scores'"):
        layer_records(_Base, "hidden_states", after="scores")(Scores)


def test_records_that_the_source_lacks_or_the_head_declares_are_refused():
    with pytest.raises(TypeError, match="no records"):
        layer_records(_Base, "vision_hidden_states")
    with pytest.raises(ValueError, match="not a per-layer record"):
        layer_records(_Base, "last_hidden_state")

    class Declares(ModelOutput):
        hidden_states: tuple[torch.FloatTensor, ...] | None = None

    with pytest.raises(TypeError, match="declares"):
        layer_records(_Base, "hidden_states")(Declares)
