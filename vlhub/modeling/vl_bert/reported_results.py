"""VL-BERT's published results (Su et al., "VL-BERT: Pre-training of Generic Visual-Linguistic Representations",
ICLR 2020), copied from the paper's Tables 1-3 (VL-BERT-BASE and VL-BERT-LARGE rows, with pre-training): what the
released models fine-tuned with the repository's configs are known to score. The authors' numbers, not vlhub's;
`vlhub convert vl_bert` writes the rows of the converted release and task into the model card."""

from ...conversion.reported import source_rows

__all__ = ["REPORTED_RESULTS"]

_TABLE = {
    n: source_rows(f"VL-BERT paper (ICLR 2020), Table {n}", "https://arxiv.org/abs/1908.08530") for n in (1, 2, 3)
}


def _row(release, task, dataset, dataset_id, split, metric, value, table, setting=""):
    return _TABLE[table](release, task, dataset, dataset_id, split, metric, value, setting=setting)


REPORTED_RESULTS = (
    *(
        _row(release, "vcr", "VCR", "vcr", split, metric, value, 1)
        for release, split, values in (
            ("base", "val", (73.8, 74.4, 55.2)),
            ("large", "val", (75.5, 77.9, 58.9)),
            ("large", "test", (75.8, 78.4, 59.7)),
        )
        for metric, value in zip(("Q->A accuracy", "QA->R accuracy", "Q->AR accuracy"), values)
    ),
    _row("base", "vqa", "VQA v2", "vqa_v2", "test-dev", "accuracy", 71.16, 2),
    _row("large", "vqa", "VQA v2", "vqa_v2", "test-dev", "accuracy", 71.79, 2),
    _row("large", "vqa", "VQA v2", "vqa_v2", "test-std", "accuracy", 72.22, 2),
    *(
        _row(release, "refcoco", "RefCOCO+", "refcoco+", split, "accuracy", value, 3, setting)
        for release, setting, values in (
            ("base", "ground-truth regions", (79.88, 82.40, 75.01)),
            ("base", "detected regions", (71.60, 77.72, 60.99)),
            ("large", "ground-truth regions", (80.31, 83.62, 75.45)),
            ("large", "detected regions", (72.59, 78.57, 62.30)),
        )
        for split, value in zip(("val", "testA", "testB"), values)
    ),
)
