"""Images end to end: a processor that carries the detector, saved and reloaded, inside the pipelines."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from transformers import AutoProcessor, pipeline

import vlhub
from vlhub.processing.detector import RegionExtractor
from vlhub.processing.processor_base import REGION_EXTRACTOR_FOLDER

from .helpers import save_tiny, tiny_detector, write_test_image


def _attach_detector(folder, seed: int = 0) -> RegionExtractor:
    processor = AutoProcessor.from_pretrained(folder)
    extractor = tiny_detector(seed=seed)
    processor.region_extractor = extractor
    processor.save_pretrained(folder)
    return extractor


@pytest.fixture
def vqa_with_detector(tmp_path, tiny_uniter_config, tiny_vocab):
    tiny_uniter_config.id2label = {0: "yes", 1: "no", 2: "red", 3: "blue", 4: "two"}
    tiny_uniter_config.label2id = {v: k for k, v in tiny_uniter_config.id2label.items()}
    folder = tmp_path / "vqa"
    save_tiny(folder, vlhub.UniterForQuestionAnswering, tiny_uniter_config, tiny_vocab)
    extractor = _attach_detector(folder)
    assert extractor.feature_dim == tiny_uniter_config.region_feature_dim
    return folder, extractor


def test_processor_with_extractor_round_trip(vqa_with_detector, tmp_path):
    folder, extractor = vqa_with_detector
    assert (folder / REGION_EXTRACTOR_FOLDER / "model.safetensors").is_file()
    processor = AutoProcessor.from_pretrained(folder)
    assert isinstance(processor, vlhub.UniterProcessor)
    loaded = processor.region_extractor
    assert isinstance(loaded, RegionExtractor)
    for name, tensor in extractor.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    image = write_test_image(tmp_path / "cat.png", 45, 60, seed=1)
    from_images = processor(text=["what colour is the cat ?"], images=[str(image)])
    from_regions = processor(text=["what colour is the cat ?"], regions=extractor(str(image)))
    assert set(from_images) == set(from_regions)
    for key in from_regions:
        torch.testing.assert_close(from_images[key], from_regions[key])
    assert from_images["region_features"].shape[-1] == 16
    two = processor(text=["is it red ?", "what is it ?"], images=[str(image), Image.open(image)])
    assert two["region_features"].shape[0] == 2
    torch.testing.assert_close(two["region_features"][1], two["region_features"][0])
    with pytest.raises(ValueError, match="too small"):
        processor(text=["is it red ?"], images=[Image.new("RGB", (8, 8))])


def test_vqa_pipeline_takes_image_paths(vqa_with_detector, tmp_path):
    folder, extractor = vqa_with_detector
    vqa = pipeline("visual-question-answering", model=str(folder))
    image = write_test_image(tmp_path / "x.png", 50, 64, seed=2)
    answers = vqa(image=str(image), question="what colour is the cat ?", top_k=2)
    assert len(answers) == 2 and answers[0]["score"] >= answers[1]["score"]
    with torch.no_grad():
        inputs = vqa.processor(text=["what colour is the cat ?"], regions=extractor(str(image)))
        logits = vqa.model(**inputs).logits
    assert answers[0]["answer"] == vqa.model.config.id2label[logits.argmax(-1).item()]
    assert answers[0]["score"] == pytest.approx(torch.sigmoid(logits.max()).item(), abs=1e-5)
    pil_answers = vqa(image=Image.open(image), question="what colour is the cat ?", top_k=2)
    assert [a["answer"] for a in pil_answers] == [a["answer"] for a in answers]
    with pytest.raises((ValueError, FileNotFoundError), match="no such image"):
        vqa(image=str(tmp_path / "missing.png"), question="what is it ?")


def test_retrieval_pipeline_takes_images(tmp_path, tiny_uniter_config, tiny_vocab):
    folder = tmp_path / "itm"
    model = save_tiny(folder, vlhub.UniterForImageTextRetrieval, tiny_uniter_config, tiny_vocab)
    extractor = _attach_detector(folder, seed=3)
    retrieval = pipeline("image-text-retrieval", model=str(folder))
    paths = [str(write_test_image(tmp_path / f"{i}.png", 40 + 8 * i, 56, seed=i)) for i in range(3)]
    ranked = retrieval(text="a red cat", images=paths, batch_size=2)
    assert sorted(r["image_index"] for r in ranked) == [0, 1, 2]
    with torch.no_grad():
        direct = [model(**retrieval.processor(text=["a red cat"], regions=extractor(p))).logits.item() for p in paths]
    for r in ranked:
        assert r["logit"] == pytest.approx(direct[r["image_index"]], abs=1e-5)
    texts = retrieval(image=paths[0], texts=["a red cat", "two dogs"])
    assert sorted(t["text"] for t in texts) == ["a red cat", "two dogs"]
