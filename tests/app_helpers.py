"""Tiny vlhub folders for the app's tests: random weights, the shapes world's tokenizer and region extractor (so they
take raw images), saved as the demo's fine-tuned folders are."""

from __future__ import annotations

from pathlib import Path

import torch

# Smaller than the "tiny" preset (whose positions each architecture sizes for its layout).
SMALLER = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
FEATURE_DIM = 16


def save_tiny_folder(folder: Path, model_type: str, task: str, seed: int = 0) -> Path:
    """A `model_type` folder with its `task` head ("vqa": the shapes world's answers), randomly initialised."""
    from vlhub.data import ANSWER_VOCABULARY, ShapesRegionExtractor, ShapesWorld, shapes_tokenizer
    from vlhub.registry import get_architecture
    from vlhub.training.pretraining import build_config

    architecture = get_architecture(model_type)
    extractor = ShapesRegionExtractor(feature_dim=FEATURE_DIM)
    scene = ShapesWorld(seed=0, num_train=1, num_validation=0, num_test=1).scenes("test")[0]
    sample = extractor(scene.image, [o.box for o in scene.objects], labels=[o.label for o in scene.objects])
    processor = architecture.build_processor(shapes_tokenizer(), FEATURE_DIM)
    config = build_config(architecture, {**architecture.config_fields("tiny"), **SMALLER}, processor, sample)
    settings = architecture.region_processor_class.settings_from_config(config)
    if settings:
        processor = architecture.build_processor(shapes_tokenizer(), FEATURE_DIM, **settings)
    if task == "vqa":
        config.id2label = dict(enumerate(ANSWER_VOCABULARY))
        config.label2id = {answer: i for i, answer in enumerate(ANSWER_VOCABULARY)}
    torch.manual_seed(seed)
    model = architecture.model_class(task)(config).eval()
    processor = processor.for_task(task)
    processor.region_extractor = extractor
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
