"""The original Unified VLP decoder, built from a checkout of LuoweiZhou/VLP, for
`bench/bench_vlp_decoding.py --original-checkout` (vlhub never ships that code: it is imported from the checkout).

The model is the original's `BertForSeq2SeqDecoder` (`pytorch_pretrained_bert/modeling.py`, on `BertModelIncr`),
built as `vlp/decode_img2txt.py` builds it for the released captioners (`enable_butd`, 100 region slots, task 3,
`length_penalty` 0, no n-gram blocking, no minimum length) at the sizes of a vlhub config, with its own random
initialisation. It decodes as that script calls it: `model(vis_feats, vis_pe, input_ids, token_type_ids,
position_ids, attention_mask, task_idx)`, greedy when `search_beam_size` is 1, its own beam search otherwise; it is
always cached (it keeps every layer's inputs and re-projects them to keys and values at each step).

Only the checkout's `pytorch_pretrained_bert/modeling.py` (and the two files it imports, `file_utils.py` and
`loss.py`) is loaded; the package's `__init__.py` is not run (it imports the optimisers, which need `apex` and
`torch._six`, neither used for decoding). `file_utils.py` imports `boto3` / `botocore` for S3 downloads of BERT
weights, never called here: empty stand-ins while it is imported, when they are not installed.
The original beam search computes its back-pointers with `torch.div(ids, K)` on integer tensors, which floored in
the torch it was written for (1.1) and divides exactly since torch 1.5 (its `gather` then fails on the float result):
`decode_original` runs it under `integer_division_floors()`, which gives integer-by-integer `torch.div` its old result
while the original decodes. The checkout is never edited.
"""

import contextlib
import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the encoders package's import helpers

from encoders import bert_sizes, import_from_checkout, stub_modules  # noqa: E402  (bench/encoders, found through the path above)

ORIGINAL_REPOSITORY = "LuoweiZhou/VLP"
MODELING = "pytorch_pretrained_bert/modeling.py"
DECODING_TASK = 3  # task_idx of image-to-text decoding in decode_img2txt.py
_IMPORT_STUBS = {
    "boto3": {},
    "botocore": {},
    "botocore.exceptions": {"ClientError": type("ClientError", (Exception,), {})},
}
# The decoder builds BERT's next-sentence head (BertPreTrainingHeads) but never calls it, and the released
# checkpoints do not hold it (the original loads them with it left at its random init): nothing to copy.
_UNUSED_BY_DECODING = ("cls.seq_relationship.",)


def import_original(checkout):
    """The checkout's `pytorch_pretrained_bert.modeling`, without running the package's `__init__.py`."""
    checkout = Path(checkout).expanduser().resolve()
    if not (checkout / MODELING).is_file():
        raise FileNotFoundError(
            f"{checkout} is not a checkout of the original Unified VLP code: no {MODELING} "
            f"(clone {ORIGINAL_REPOSITORY})"
        )
    package = {"pytorch_pretrained_bert": {"__path__": [str(checkout / "pytorch_pretrained_bert")]}}
    with stub_modules(_IMPORT_STUBS), stub_modules(package, probe=False):
        return import_from_checkout(checkout, MODELING, "pytorch_pretrained_bert.modeling")


def build_original(checkout, config, beams: int) -> torch.nn.Module:
    """`BertForSeq2SeqDecoder` at the sizes of the vlhub `UnifiedVlpConfig` `config`, eval mode, random weights."""
    original = import_original(checkout)
    bert_config = original.BertConfig(
        config.vocab_size,
        **bert_sizes(config),
        hidden_act="gelu",
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        initializer_range=config.initializer_range,
    )
    if config.region_location_dim != 6 + 1601 or config.region_feature_dim != 2048:
        raise ValueError("the original decoder's region layers are fixed at 2048-d features and 1607-d vis_pe")
    return original.BertForSeq2SeqDecoder(
        bert_config,
        mask_word_id=config.mask_token_id,
        search_beam_size=beams,
        length_penalty=0.0,
        eos_id=config.eos_token_id,
        forbid_duplicate_ngrams=False,
        min_len=None,
        enable_butd=True,
        len_vis_input=config.num_regions,
    ).eval()


def copy_original_weights(original, model) -> None:
    """The original's weights into vlhub's `UnifiedVlpForConditionalGeneration` through vlhub's converter's key map
    (as `vlhub convert unified_vlp` does with a captioning checkpoint); every parameter must be set."""
    from vlhub.conversion.common import ConversionReport, convert_state_dict
    from vlhub.modeling.unified_vlp.convert_unified_vlp import unified_vlp_key_map

    state_dict = {k: v for k, v in original.state_dict().items() if not k.startswith(_UNUSED_BY_DECODING)}
    report = ConversionReport(source="Unified VLP BertForSeq2SeqDecoder")
    convert_state_dict(state_dict, model, unified_vlp_key_map("captioning"), report)
    if report.initialized:
        raise RuntimeError(f"vlhub parameters the original's weights did not set: {sorted(report.initialized)}")


def original_inputs(prompt: dict, steps: int, config) -> dict:
    """The original decoder's arguments for vlhub's prompt (`[CLS] regions [SEP]`, region features and vis_pe),
    as its `Preprocess4Seq2seqDecoder` lays them out for `steps` words: token types 4 for the prompt and 5 for the
    words, positions 0.., the seq2seq mask (the prompt block attends to itself both ways, word i to the prompt and
    words ≤ i)."""
    input_ids = prompt["input_ids"]
    batch, prompt_length = input_ids.shape
    total = prompt_length + steps
    positions = torch.arange(total, device=input_ids.device)
    in_prompt = positions < prompt_length
    visible = in_prompt[None, :] | ((positions[None, :] <= positions[:, None]) & ~in_prompt[:, None])
    token_types = torch.where(in_prompt, config.s2s_image_token_type_id, config.s2s_text_token_type_id)
    return dict(
        vis_feats=prompt["region_features"],
        vis_pe=prompt["region_locations"],
        input_ids=input_ids,
        token_type_ids=token_types.expand(batch, -1).contiguous(),
        position_ids=positions.expand(batch, -1).contiguous(),
        attention_mask=visible.long().expand(batch, -1, -1).contiguous(),
        task_idx=torch.full((batch,), DECODING_TASK, dtype=torch.long, device=input_ids.device),
    )


@contextlib.contextmanager
def integer_division_floors():
    """`torch.div` of two integer operands without a rounding mode floors (torch < 1.5), for the original's code."""
    true_div = torch.div

    def div(input, other, *args, **kwargs):
        integers = not torch.is_floating_point(input) and (
            isinstance(other, int) or (isinstance(other, torch.Tensor) and not torch.is_floating_point(other))
        )
        if integers and not args and "rounding_mode" not in kwargs:
            return true_div(input, other, rounding_mode="floor")
        return true_div(input, other, *args, **kwargs)

    with mock.patch.object(torch, "div", div):
        yield


def decode_original(original, inputs: dict, beams: int, steps: int) -> torch.Tensor:
    """(batch, steps) word ids: greedy (`beams` 1, every step, no early stop) or the original's beam search (its
    back-traced best sequence, zero-padded after the end token)."""
    original.search_beam_size = beams
    with integer_division_floors():
        output = original(**inputs)
    if beams == 1:
        return output[0]
    return output["pred_seq"][:, :steps]
