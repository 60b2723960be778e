"""ViLBERT's published results (Lu et al., "ViLBERT: Pretraining Task-Agnostic Visiolinguistic Representations for
Vision-and-Language Tasks", NeurIPS 2019), copied from the paper's Table 1 (the full ViLBERT row; test-server figures
are the ones in parentheses there): what the jiasenlu/vilbert_beta releases are known to score — the fine-tuned
"beta" checkpoints per task, and the pre-trained checkpoint ranking Flickr30k images without fine-tuning. The
12-in-1 multi-task release has none here: its paper is not among vlhub's sources. The authors' numbers, not vlhub's;
`vlhub convert vilbert` writes the rows of the converted release and task into the model card."""

from ...conversion.reported import source_rows

__all__ = ["REPORTED_RESULTS"]

_ZERO_SHOT = "zero-shot: the pre-trained model, not fine-tuned"
_row = source_rows("ViLBERT paper (NeurIPS 2019), Table 1", "https://arxiv.org/abs/1908.02265")


REPORTED_RESULTS = (
    _row("beta", "vqa", "VQA v2", "vqa_v2", "test-dev", "accuracy", 70.55),
    _row("beta", "vqa", "VQA v2", "vqa_v2", "test-std", "accuracy", 70.92),
    _row("beta", "vcr", "VCR", "vcr", "val", "Q->A accuracy", 72.42),
    _row("beta", "vcr", "VCR", "vcr", "val", "QA->R accuracy", 74.47),
    _row("beta", "vcr", "VCR", "vcr", "val", "Q->AR accuracy", 54.04),
    _row("beta", "vcr", "VCR", "vcr", "test", "Q->A accuracy", 73.3),
    _row("beta", "vcr", "VCR", "vcr", "test", "QA->R accuracy", 74.6),
    _row("beta", "vcr", "VCR", "vcr", "test", "Q->AR accuracy", 54.8),
    _row("beta", "re", "RefCOCO+", "refcoco+", "val", "accuracy", 72.34),
    _row("beta", "re", "RefCOCO+", "refcoco+", "testA", "accuracy", 78.52),
    _row("beta", "re", "RefCOCO+", "refcoco+", "testB", "accuracy", 62.61),
    _row("beta", "retrieval", "Flickr30k", "flickr30k", "test", "image retrieval R@1", 58.20),
    _row("beta", "retrieval", "Flickr30k", "flickr30k", "test", "image retrieval R@5", 84.90),
    _row("beta", "retrieval", "Flickr30k", "flickr30k", "test", "image retrieval R@10", 91.52),
    *(
        _row("pretrained", "zero_shot_retrieval", "Flickr30k", "flickr30k", "test", metric, value, setting=_ZERO_SHOT)
        for metric, value in (
            ("image retrieval R@1", 31.86),
            ("image retrieval R@5", 61.12),
            ("image retrieval R@10", 72.80),
        )
    ),
)
