"""Unified VLP's released tokenizer: bert-base-cased word pieces with eleven `[unused*]` entries renamed.

The original reads `vocab.txt` with its own `load_vocab` (LuoweiZhou/VLP, `pytorch_pretrained_bert/tokenization.py`),
which renames `[unused1]` to `[X_SEP]` and `[unused2]` … `[unused11]` to `[SEP_0]` … `[SEP_9]` as it reads them:
same ids, other token strings. So a caption holding id 2 was printed `[SEP_0]` by `decode_img2txt.py` (and scored
so by the COCO metrics), and `[X_SEP]` is one of the words its BasicTokenizer never splits. `vlp_release_tokenizer`
builds the same vocabulary into a transformers `BertTokenizer`, which a converted folder saves with its processor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import BertTokenizer, PreTrainedTokenizerBase


__all__ = ["VLP_TOKEN_RENAMES", "VLP_NEVER_SPLIT", "vlp_release_tokenizer"]

# vocab.txt entry → the token string the original gives it (ids unchanged).
VLP_TOKEN_RENAMES = {"[unused1]": "[X_SEP]", **{f"[unused{i + 2}]": f"[SEP_{i}]" for i in range(10)}}
# Renamed tokens the original's BasicTokenizer keeps whole in input text (its `never_split` adds "[X_SEP]" to
# BERT's special tokens); "[SEP_0]" … written in text is split into word pieces by the original too.
VLP_NEVER_SPLIT = ("[X_SEP]",)


def vlp_release_tokenizer(tokenizer: PreTrainedTokenizerBase) -> BertTokenizer:
    """A `BertTokenizer` (cased, as the original) with `tokenizer`'s vocabulary and VLP's renames applied.

    `tokenizer` is any word-piece tokenizer with a BERT vocabulary (bert-base-cased, or a fixture's `vocab.txt`).
    Entries the vocabulary lacks are not renamed (the original renames only what it reads). A vocabulary that already
    holds a renamed string at another id cannot take the rename (two ids would share one string): `ValueError`.
    """
    from transformers import AddedToken, BertTokenizer

    vocab = tokenizer.get_vocab()
    for old, new in VLP_TOKEN_RENAMES.items():
        if new in vocab and vocab.get(old, vocab[new]) != vocab[new]:
            raise ValueError(
                f"the vocabulary has both {old!r} (id {vocab[old]}) and {new!r} (id {vocab[new]}): "
                "Unified VLP's rename of one into the other would give two ids one string"
            )
    renamed = {VLP_TOKEN_RENAMES.get(token, token): index for token, index in vocab.items()}
    special = {
        name: getattr(tokenizer, name) for name in ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
    }
    release = BertTokenizer(vocab=renamed, do_lower_case=False, **special, model_max_length=tokenizer.model_max_length)
    release.add_tokens([AddedToken(token, normalized=False) for token in VLP_NEVER_SPLIT if token in renamed])
    return release
