"""Unified VLP's published results, copied from the original README's "Inference and Testing" tables (LuoweiZhou/VLP,
"the expected result outcomes from our Unified VLP checkpoints"), which are also the paper's Tables 2 and 3 (Zhou et
al., AAAI 2020). The captioning release has three fine-tuned checkpoints (COCO with cross-entropy, COCO with CIDEr
optimization (SCST), Flickr30k): the card lists all three, each row saying which. The released VQA checkpoint is the
"train only" one, evaluated on the val split ("Dev"). The authors' numbers, not vlhub's; `vlhub convert unified_vlp`
writes the rows of the converted task into the model card."""

from ...conversion.reported import source_rows

__all__ = ["REPORTED_RESULTS"]

_row = source_rows(
    "Unified VLP README, Inference and Testing",
    "https://github.com/LuoweiZhou/VLP#inference-and-testing",
    release="base",
)


def _captioning(dataset, dataset_id, setting, bleu4, meteor, cider, spice):
    """The four caption metrics of one checkpoint's line of the table (Karpathy test split)."""
    scores = (("BLEU@4", bleu4), ("METEOR", meteor), ("CIDEr", cider), ("SPICE", spice))
    return tuple(
        _row("captioning", dataset, dataset_id, "Karpathy test", metric, value, setting=setting)
        for metric, value in scores
    )


REPORTED_RESULTS = (
    *_captioning("COCO Captions", "coco", "COCO checkpoint, cross-entropy", 36.5, 28.4, 116.9, 21.2),
    *_captioning("COCO Captions", "coco", "COCO checkpoint, CIDEr optimization (SCST)", 39.5, 29.3, 129.3, 23.2),
    *_captioning("Flickr30k Captions", "flickr30k", "Flickr30k checkpoint", 30.1, 23.0, 67.4, 17.0),
    _row(
        "vqa",
        "VQA v2",
        "vqa_v2",
        "val (Dev)",
        "accuracy",
        67.4,
        setting="trained on train only (the released checkpoint)",
    ),
    _row("vqa", "VQA v2", "vqa_v2", "test-dev", "accuracy", 70.5, setting="trained on train+val"),
    _row("vqa", "VQA v2", "vqa_v2", "test-std", "accuracy", 70.7, setting="trained on train+val"),
)
