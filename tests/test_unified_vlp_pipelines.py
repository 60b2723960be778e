"""Captioning pipelines ("image-captioning", "image-to-text") with a vlhub captioner, transformers' own behaviour of
"image-to-text" for other models, and the VQA pipeline with Unified VLP."""

import warnings

import numpy as np
import PIL.Image
import pytest
import torch
import transformers
import transformers.pipelines as transformers_pipelines
from packaging import version
from transformers import (
    BertTokenizer,
    BlipConfig,
    BlipForConditionalGeneration,
    BlipImageProcessor,
    BlipProcessor,
    pipeline,
)
from transformers.pipelines.image_text_to_text import ImageTextToTextPipeline

import vlhub
from vlhub.pipelines import ImageCaptioningPipeline, VisualQuestionAnsweringPipeline

from .test_unified_vlp_modeling import CLASSES, FEATURES, REGIONS, make_regions, tiny_config


def test_captioning_tasks_are_registered_and_image_to_text_is_not_rewritten():
    # If a transformers upgrade changes how "image-to-text" is rewritten, this test says so (5.19 and later rewrite it;
    # 5.17 and 5.18 do not, and have no removed tasks).
    resolve = getattr(transformers_pipelines, "_resolve_deprecated_task", None)
    if resolve is not None or version.parse(transformers.__version__).release >= (5, 19):
        assert resolve("image-to-text") == "image-to-text"
        assert resolve("image-text-to-text") == "image-text-to-text"
        with pytest.raises(KeyError, match="removed"):
            resolve("summarization")
    tasks = transformers_pipelines.PIPELINE_REGISTRY.get_supported_tasks()
    assert "image-to-text" in tasks and "image-captioning" in tasks and "image-text-to-text" in tasks


@pytest.fixture(scope="module")
def captioner_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vlp-captioner")
    vocab = folder / "vocab.txt"
    words = ["what", "colour", "is", "the", "cat", "dog", "a", "red", "blue", "on", "table", "?", "yes", "no"]
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    torch.manual_seed(0)
    vlhub.UnifiedVlpForConditionalGeneration(tiny_config(max_position_embeddings=32)).save_pretrained(folder)
    vlhub.UnifiedVlpProcessor(
        feature_extractor=vlhub.UnifiedVlpRegionProcessor(
            region_feature_dim=FEATURES, num_classes=CLASSES, max_regions=REGIONS
        ),
        tokenizer=BertTokenizer(vocab=str(vocab), do_lower_case=False),
    ).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("task", ["image-captioning", "image-to-text"])
def test_captioning_pipeline_single_batched_and_generate_kwargs(captioner_folder, task):
    captioner = pipeline(task, model=str(captioner_folder))
    assert isinstance(captioner, ImageCaptioningPipeline)
    assert isinstance(captioner.model, vlhub.UnifiedVlpForConditionalGeneration)
    images = [make_regions(4), make_regions(2, 1), make_regions(3, 2)]
    model, processor = captioner.model, captioner.processor

    def direct(regions, **kwargs):
        return processor.batch_decode(model.generate(**processor(regions=[regions]), **kwargs))[0]

    single = captioner(images[0])
    assert single == [{"generated_text": direct(images[0], max_new_tokens=20, do_sample=False)}]
    batched = captioner(images, batch_size=2)
    assert batched == [captioner(image) for image in images]
    beams = captioner(images, generate_kwargs={"num_beams": 2, "max_new_tokens": 3})
    assert [b[0]["generated_text"] for b in beams] == [direct(i, num_beams=2, max_new_tokens=3) for i in images]
    assert captioner(images[1], max_new_tokens=2) == [{"generated_text": direct(images[1], max_new_tokens=2)}]


def test_captioning_pipeline_takes_images_through_the_region_extractor(captioner_folder):
    captioner = pipeline("image-captioning", model=str(captioner_folder))
    seen = []

    def extractor(images):
        seen.extend(images)
        return [make_regions(4, seed=len(seen))]

    captioner.processor.region_extractor = extractor
    image = PIL.Image.fromarray((np.random.default_rng(0).random((24, 32, 3)) * 255).astype("uint8"))
    out = captioner(image)
    assert seen == [image] and isinstance(out[0]["generated_text"], str)


def test_captioning_pipeline_bad_inputs(captioner_folder):
    captioner = pipeline("image-captioning", model=str(captioner_folder))
    with pytest.raises(ValueError, match="needs images"):
        captioner()
    with pytest.raises(ValueError, match="empty list"):
        captioner([])
    with pytest.raises(ValueError, match="no region extractor"):
        captioner("photo.jpg")
    with pytest.raises(TypeError, match="generate_kwargs"):
        captioner(make_regions(4), num_beams=2)


def test_image_to_text_keeps_transformers_behaviour_for_other_models(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "cat"]) + "\n")
    config = BlipConfig(
        text_config=dict(
            vocab_size=7,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=32,
            bos_token_id=2,
            sep_token_id=3,
        ),
        vision_config=dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=16,
        ),
        projection_dim=16,
    )
    processor = BlipProcessor(
        image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=BertTokenizer(vocab=str(vocab))
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other = pipeline("image-to-text", model=BlipForConditionalGeneration(config), processor=processor)
    assert type(other) is ImageTextToTextPipeline and other.task == "image-text-to-text"
    assert any("image-text-to-text" in str(w.message) for w in caught)
    image = PIL.Image.fromarray(np.zeros((32, 32, 3), dtype="uint8"))
    with pytest.raises(ValueError, match="provide text"):  # transformers' chat pipeline wants a prompt
        other(image)


def test_vqa_pipeline_with_unified_vlp(tmp_path):
    from vlhub.modeling.unified_vlp.convert_unified_vlp import convert_unified_vlp

    from .conftest import fixtures_root
    from .release_files import unified_vlp_files

    original = fixtures_root() / "unified_vlp" / "original"
    if not original.is_dir():
        pytest.skip("no Unified VLP fixture")
    files = unified_vlp_files(original)
    convert_unified_vlp(
        files["checkpoints"]["vqa2"], tmp_path / "vqa", config=files["config"], tokenizer=files["vocab"]
    )
    vqa = pipeline("visual-question-answering", model=str(tmp_path / "vqa"))
    assert isinstance(vqa, VisualQuestionAnsweringPipeline) and isinstance(
        vqa.model, vlhub.UnifiedVlpForQuestionAnswering
    )
    regions = vlhub.RegionFeatures(
        features=torch.rand(100, 2048),
        boxes=torch.tensor([[0.0, 0.0, 10.0, 10.0]]).repeat(100, 1) + torch.arange(100)[:, None] * 0.1,
        image_size=(200, 200),
        class_probs=torch.softmax(torch.randn(100, 1601), -1),
        scores=torch.rand(100) * 0.5 + 0.3,
    )
    answers = vqa(image=regions, question="tok1 tok2", top_k=3)
    assert len(answers) == 3 and all(a["answer"].startswith("answer_") for a in answers)
    with torch.no_grad():
        out = vqa.model(**vqa.processor(text=["tok1 tok2"], regions=[regions]))
    assert answers[0]["answer"] == vqa.model.config.id2label[out.logits[0, 1:].argmax().item() + 1]
    # As the original evaluation (argmax(logits[:, 1:]) + 1), answer 0 (Pythia's <unk>) is never listed, even when
    # its logit is the largest.
    config = vqa.model.config
    assert config.unknown_answer_id == 0
    with torch.no_grad():
        vqa.model.ans_classifier[2].bias[0] = 1e4
    everything = vqa(image=regions, question="tok1 tok2", top_k=config.num_labels)
    assert len(everything) == config.num_labels - 1 and config.id2label[0] not in {a["answer"] for a in everything}
    with torch.no_grad():
        out = vqa.model(**vqa.processor(text=["tok1 tok2"], regions=[regions]))
    assert out.logits.argmax(-1).item() == 0 and out.predicted_answer_ids.item() != 0
    assert everything[0]["answer"] == config.id2label[out.predicted_answer_ids.item()]


def test_a_captioner_folder_is_refused_by_the_vqa_pipeline_naming_what_it_holds(captioner_folder):
    # Built anyway, it would answer with a randomly initialised 2-label head (LABEL_0).
    with pytest.raises(
        ValueError,
        match=r"pipeline\('visual-question-answering'\): .*vlp-captioner.* holds "
        r"UnifiedVlpForConditionalGeneration \(Unified VLP's captioning model\), which cannot do "
        r"visual-question-answering; pass a folder holding UnifiedVlpForQuestionAnswering",
    ):
        pipeline("visual-question-answering", model=str(captioner_folder))


def test_the_captioning_pipeline_takes_image_as_the_other_pipelines_do(captioner_folder):
    captioner = pipeline("image-captioning", model=str(captioner_folder))
    regions = make_regions(4)
    assert captioner(image=regions) == captioner(regions)
    with pytest.raises(ValueError, match="not both"):
        captioner(regions, image=regions)
