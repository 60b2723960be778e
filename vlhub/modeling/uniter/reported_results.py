"""UNITER's published results (Chen et al., "UNITER: UNiversal Image-TExt Representation Learning", ECCV 2020),
copied from the paper's Table 4 (UNITER-base and UNITER-large columns): what the released `uniter-base.pt` /
`uniter-large.pt`, fine-tuned with the repository's configs, are known to score. The authors' numbers, not vlhub's;
`vlhub convert uniter` writes the rows of the converted release and task into the model card."""

from ...conversion.reported import source_rows

__all__ = ["REPORTED_RESULTS"]

_ZERO_SHOT = "zero-shot: the pre-trained model, not fine-tuned"
_row = source_rows("UNITER paper (ECCV 2020), Table 4", "https://arxiv.org/abs/1909.11740")


def _rows(task, dataset, dataset_id, split, metric, base, large, setting=""):
    """The UNITER-base and UNITER-large columns of one line of the table."""
    return tuple(
        _row(release, task, dataset, dataset_id, split, metric, value, setting=setting)
        for release, value in (("base", base), ("large", large))
    )


REPORTED_RESULTS = (
    *_rows("vqa", "VQA v2", "vqa_v2", "test-dev", "accuracy", 72.27, 73.24),
    *_rows("vqa", "VQA v2", "vqa_v2", "test-std", "accuracy", 72.46, 73.40),
    *_rows("vcr", "VCR", "vcr", "test", "Q->A accuracy", 75.00, 77.30),
    *_rows("vcr", "VCR", "vcr", "test", "QA->R accuracy", 77.20, 80.80),
    *_rows("vcr", "VCR", "vcr", "test", "Q->AR accuracy", 58.20, 62.80),
    *_rows("nlvr2", "NLVR2", "nlvr2", "dev", "accuracy", 77.14, 78.40),
    *_rows("nlvr2", "NLVR2", "nlvr2", "test-P", "accuracy", 77.87, 79.50),
    *_rows("ve", "SNLI-VE", "snli_ve", "val", "accuracy", 78.56, 79.28),
    *_rows("ve", "SNLI-VE", "snli_ve", "test", "accuracy", 78.02, 78.98),
    *_rows("retrieval", "Flickr30k", "flickr30k", "test", "image retrieval R@1", 71.50, 73.66),
    *_rows("retrieval", "Flickr30k", "flickr30k", "test", "text retrieval R@1", 84.70, 88.20),
    *_rows("retrieval", "COCO", "coco", "test", "image retrieval R@1", 48.42, 51.72),
    *_rows("retrieval", "COCO", "coco", "test", "text retrieval R@1", 63.28, 66.60),
    *_rows(
        "zero_shot_retrieval", "Flickr30k", "flickr30k", "test", "image retrieval R@1", 62.34, 65.82, setting=_ZERO_SHOT
    ),
    *_rows(
        "zero_shot_retrieval", "Flickr30k", "flickr30k", "test", "text retrieval R@1", 75.10, 77.50, setting=_ZERO_SHOT
    ),
    *_rows("re", "RefCOCO+", "refcoco+", "val", "accuracy", 82.84, 84.04, setting="ground-truth regions"),
    *_rows("re", "RefCOCO+", "refcoco+", "testA", "accuracy", 85.70, 85.87, setting="ground-truth regions"),
    *_rows("re", "RefCOCO+", "refcoco+", "testB", "accuracy", 78.11, 78.89, setting="ground-truth regions"),
    *_rows("re", "RefCOCO+", "refcoco+", "val", "accuracy", 74.72, 74.94, setting="detected regions"),
    *_rows("re", "RefCOCO+", "refcoco+", "testA", "accuracy", 80.65, 81.37, setting="detected regions"),
    *_rows("re", "RefCOCO+", "refcoco+", "testB", "accuracy", 65.15, 65.35, setting="detected regions"),
    *_rows("re", "RefCOCOg", "refcocog", "val", "accuracy", 86.52, 87.85, setting="ground-truth regions"),
    *_rows("re", "RefCOCOg", "refcocog", "test", "accuracy", 86.52, 87.73, setting="ground-truth regions"),
    *_rows("re", "RefCOCOg", "refcocog", "val", "accuracy", 74.31, 74.86, setting="detected regions"),
    *_rows("re", "RefCOCOg", "refcocog", "test", "accuracy", 74.51, 75.77, setting="detected regions"),
)
