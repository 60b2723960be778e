"""TDEN's published results for the released checkpoints, copied from X-modaler's README ("Model Zoo and Baselines":
the TDEN rows, YehLi/xmodaler), which hosts the release vlhub converts. The TDEN paper's Table 1 (Li et al., AAAI
2021) reports its own model's figures, which differ; they are not these checkpoints' and are not listed. X-modaler's
README names no split for VQA, VCR and the captioning tables: the rows say so. The authors' numbers, not vlhub's;
`vlhub convert tden` writes the rows of the converted task into the model card."""

from ...conversion.reported import source_rows

__all__ = ["REPORTED_RESULTS"]

_UNSTATED = "not stated"
_row = source_rows(
    "X-modaler README, Model Zoo and Baselines",
    "https://github.com/YehLi/xmodaler#model-zoo-and-baselines",
    release="base",
)


REPORTED_RESULTS = (
    *(
        _row("captioning", "COCO Captions", "coco", _UNSTATED, metric, value, setting="cross-entropy checkpoint")
        for metric, value in (("BLEU@4", 34.9), ("METEOR", 28.7), ("CIDEr-D", 116.3), ("SPICE", 22.0))
    ),
    *(
        _row("captioning", "COCO Captions", "coco", _UNSTATED, metric, value, setting="CIDEr optimization checkpoint")
        for metric, value in (("BLEU@4", 40.1), ("METEOR", 29.6), ("CIDEr-D", 132.6), ("SPICE", 23.4))
    ),
    _row("vqa", "VQA v2", "vqa_v2", _UNSTATED, "accuracy", 71.9),
    _row("retrieval", "Flickr30k", "flickr30k", _UNSTATED, "image retrieval R@1", 62.0),
    _row("retrieval", "Flickr30k", "flickr30k", _UNSTATED, "image retrieval R@5", 86.6),
    _row("retrieval", "Flickr30k", "flickr30k", _UNSTATED, "image retrieval R@10", 92.4),
    _row("vcr", "VCR", "vcr", _UNSTATED, "Q->A accuracy", 75.0),
    _row("vcr", "VCR", "vcr", _UNSTATED, "QA->R accuracy", 76.5),
    _row("vcr", "VCR", "vcr", _UNSTATED, "Q->AR accuracy", 57.7),
)
