"""VL-BERT's published results (Su et al., "VL-BERT: Pre-training of Generic Visual-Linguistic Representations",
ICLR 2020), copied from the paper's Tables 1-3 (VL-BERT-BASE and VL-BERT-LARGE rows, with pre-training): what the
released models fine-tuned with the repository's configs are known to score. The authors' numbers, not vlhub's;
`vlhub convert vl_bert` writes the rows of the converted release and task into the model card."""

from ...conversion.reported import source_rows

__all__ = ["REPORTED_RESULTS"]

_TABLE = {n: source_rows(f"VL-BERT paper (ICLR 2020), Table {n}", "https://arxiv.org/abs/1908.08530")
          for n in (1, 2, 3)}


def _row(release, task, dataset, dataset_id, split, metric, value, table, setting=""):
    return _TABLE[table](release, task, dataset, dataset_id, split, metric, value, setting=setting)


REPORTED_RESULTS = (
    _row("base", "vcr", "VCR", "vcr", "val", "Q->A accuracy", 73.8, 1),
    _row("base", "vcr", "VCR", "vcr", "val", "QA->R accuracy", 74.4, 1),
    _row("base", "vcr", "VCR", "vcr", "val", "Q->AR accuracy", 55.2, 1),
    _row("large", "vcr", "VCR", "vcr", "val", "Q->A accuracy", 75.5, 1),
    _row("large", "vcr", "VCR", "vcr", "val", "QA->R accuracy", 77.9, 1),
    _row("large", "vcr", "VCR", "vcr", "val", "Q->AR accuracy", 58.9, 1),
    _row("large", "vcr", "VCR", "vcr", "test", "Q->A accuracy", 75.8, 1),
    _row("large", "vcr", "VCR", "vcr", "test", "QA->R accuracy", 78.4, 1),
    _row("large", "vcr", "VCR", "vcr", "test", "Q->AR accuracy", 59.7, 1),
    _row("base", "vqa", "VQA v2", "vqa_v2", "test-dev", "accuracy", 71.16, 2),
    _row("large", "vqa", "VQA v2", "vqa_v2", "test-dev", "accuracy", 71.79, 2),
    _row("large", "vqa", "VQA v2", "vqa_v2", "test-std", "accuracy", 72.22, 2),
    *(_row(release, "refcoco", "RefCOCO+", "refcoco+", split, "accuracy", value, 3, setting)
      for release, setting, values in (
          ("base", "ground-truth regions", (79.88, 82.40, 75.01)), ("base", "detected regions", (71.60, 77.72, 60.99)),
          ("large", "ground-truth regions", (80.31, 83.62, 75.45)),
          ("large", "detected regions", (72.59, 78.57, 62.30)))
      for split, value in zip(("val", "testA", "testB"), values)),
)
