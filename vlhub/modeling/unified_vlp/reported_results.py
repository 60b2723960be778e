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


REPORTED_RESULTS = (
    *(
        _row(
            "captioning",
            "COCO Captions",
            "coco",
            "Karpathy test",
            metric,
            value,
            setting="COCO checkpoint, cross-entropy",
        )
        for metric, value in (("BLEU@4", 36.5), ("METEOR", 28.4), ("CIDEr", 116.9), ("SPICE", 21.2))
    ),
    *(
        _row(
            "captioning",
            "COCO Captions",
            "coco",
            "Karpathy test",
            metric,
            value,
            setting="COCO checkpoint, CIDEr optimization (SCST)",
        )
        for metric, value in (("BLEU@4", 39.5), ("METEOR", 29.3), ("CIDEr", 129.3), ("SPICE", 23.2))
    ),
    *(
        _row(
            "captioning",
            "Flickr30k Captions",
            "flickr30k",
            "Karpathy test",
            metric,
            value,
            setting="Flickr30k checkpoint",
        )
        for metric, value in (("BLEU@4", 30.1), ("METEOR", 23.0), ("CIDEr", 67.4), ("SPICE", 17.0))
    ),
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
