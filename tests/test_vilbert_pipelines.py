"""`pipeline("visual-question-answering")` and `pipeline("image-text-retrieval")` on converted ViLBERT folders (the
beta and the 12-in-1 releases of the fixture), with RegionFeatures or images, batched."""

import json

import pytest
import torch
from transformers import pipeline

import vlhub
from vlhub.modeling.vilbert.convert_vilbert import convert_vilbert

from .conftest import fixtures_root, write_vocab
from .helpers import vqa_single_and_batched
from .release_files import vilbert_files

ORIGINAL = fixtures_root() / "vilbert" / "original"
pytestmark = pytest.mark.skipif(not ORIGINAL.is_dir(), reason="no ViLBERT fixture")
if ORIGINAL.is_dir():  # found as the original finds them, whatever the fixture set names them
    FILES = vilbert_files(ORIGINAL)
    CONFIG = FILES["config"]
    CHECKPOINTS = {
        "beta": FILES["checkpoints"]["beta_vqa"],
        "mt": FILES["checkpoints"]["mt"],
        "pretrained": FILES["checkpoints"]["pretrain"],
    }


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    work = tmp_path_factory.mktemp("vilbert-pipelines")
    size = json.loads(CONFIG.read_text())["vocab_size"]
    vocab = write_vocab(work / "vocab.txt", size, {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103})
    words = ["what", "colour", "is", "the", "cat", "a", "red", "dog", "two"]
    lines = vocab.read_text().splitlines()
    for i, word in enumerate(words):
        lines[200 + i] = word
    vocab.write_text("\n".join(lines) + "\n")
    out = {}
    for release, task in (
        ("beta", "vqa"),
        ("mt", "vqa"),
        ("beta", "retrieval"),
        ("mt", "retrieval"),
        ("pretrained", "pretraining"),
        ("pretrained", "retrieval"),
    ):
        folder = work / f"{release}-{task}"
        convert_vilbert(CHECKPOINTS[release], folder, config=CONFIG, task=task, tokenizer=vocab)
        out[release, task] = folder
    return out


def regions(n, seed):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 20
    return vlhub.RegionFeatures(torch.rand(n, 2048, generator=g), torch.cat([xy, xy + 5], 1), (40, 50))


class MeanFeatures:
    """A stand-in region extractor: four quadrant boxes, features from the image's mean."""

    def __call__(self, images):
        out = []
        for image in images:
            height, width = image.shape[-2:]
            boxes = torch.tensor(
                [
                    [0, 0, width / 2, height / 2],
                    [width / 2, 0, width, height / 2],
                    [0, height / 2, width / 2, height],
                    [width / 2, height / 2, width, height],
                ]
            )
            out.append(
                vlhub.RegionFeatures(
                    torch.full((4, 2048), float(image.mean())) + torch.arange(4.0)[:, None], boxes, (height, width)
                )
            )
        return out


@pytest.mark.parametrize("release", ["beta", "mt"])
def test_vqa_pipeline(folders, release):
    vqa = pipeline("visual-question-answering", model=str(folders[release, "vqa"]))
    assert isinstance(vqa.model, vlhub.VilbertForQuestionAnswering)
    images = [regions(n, n) for n in (3, 5, 8)]
    questions = ["what colour is the cat", "is the dog red", "two"]
    single = vqa_single_and_batched(vqa, images, questions)
    with torch.no_grad():
        logits = vqa.model(**vqa.processor(text=[questions[1]], regions=[images[1]])).logits
    assert single[1][0]["answer"] == vqa.model.config.id2label[logits.argmax(-1).item()]
    assert single[1][0]["score"] == pytest.approx(torch.sigmoid(logits.max()).item(), abs=1e-5)
    vqa.processor.region_extractor = MeanFeatures()
    from_images = vqa(image=[torch.rand(3, 20, 30), torch.rand(3, 24, 16)], question=questions[:2], top_k=2)
    assert len(from_images) == 2 and len(from_images[0]) == 2


@pytest.mark.parametrize(
    "release, task",
    [("beta", "retrieval"), ("mt", "retrieval"), ("pretrained", "retrieval"), ("pretrained", "pretraining")],
)
def test_retrieval_pipeline(folders, release, task):
    retrieval = pipeline("image-text-retrieval", model=str(folders[release, task]))
    images = [regions(n, n) for n in (3, 5, 8)]
    texts = ["a red cat", "two dogs", "what"]
    ranked = retrieval(image=images[0], texts=texts, batch_size=2)
    assert sorted(r["text"] for r in ranked) == sorted(texts)
    assert [r["logit"] for r in ranked] == sorted((r["logit"] for r in ranked), reverse=True)
    with torch.no_grad():
        for r in ranked:
            outputs = retrieval.model(**retrieval.processor(text=[r["text"]], regions=[images[0]]))
            if task == "pretraining":  # zero-shot: the original's softmax(alignment)[0]
                assert r["score"] == pytest.approx(outputs.alignment_logits.softmax(-1)[0, 0].item(), abs=1e-5)
            else:
                assert r["logit"] == pytest.approx(outputs.logits.item(), abs=1e-5)
    by_image = retrieval(text="a red cat", images=images, batch_size=3)
    assert sorted(r["image_index"] for r in by_image) == [0, 1, 2]
    assert [r["image_index"] for r in by_image] == [
        r["image_index"] for r in retrieval(text="a red cat", images=images)
    ]


def test_zero_shot_conversion_and_pretraining_folder_rank_alike(folders):
    converted = pipeline("image-text-retrieval", model=str(folders["pretrained", "retrieval"]))
    pretraining = pipeline("image-text-retrieval", model=str(folders["pretrained", "pretraining"]))
    image, texts = regions(4, 1), ["a red cat", "two dogs", "what"]
    a, b = converted(image=image, texts=texts), pretraining(image=image, texts=texts)
    assert [r["text"] for r in a] == [r["text"] for r in b]
    assert [r["score"] for r in a] == pytest.approx([r["score"] for r in b], abs=1e-5)
