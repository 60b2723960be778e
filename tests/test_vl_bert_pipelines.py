"""VL-BERT in vlhub's pipelines: visual question answering from regions or images; retrieval refused with a reason."""

import pytest
import torch
from transformers import AutoProcessor, BertTokenizer, pipeline

import vlhub
from vlhub.pipelines import VisualQuestionAnsweringPipeline

from .helpers import random_regions, tiny_detector, vqa_single_and_batched, write_test_image
from .test_vl_bert_transformers_checks import tiny_config

ANSWERS = ["yes", "no", "red", "blue", "two"]


def _save(folder, model_class, vocab, answer_slot):
    config = tiny_config(
        mask_token_id=4, id2label=dict(enumerate(ANSWERS)), label2id={a: i for i, a in enumerate(ANSWERS)}
    )
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.save_pretrained(folder)
    processor = vlhub.VlBertProcessor(
        feature_extractor=vlhub.VlBertRegionProcessor(region_feature_dim=config.region_feature_dim),
        tokenizer=BertTokenizer(vocab=str(vocab), do_lower_case=True),
        answer_slot=answer_slot,
    )
    processor.save_pretrained(folder)
    return model


@pytest.fixture
def vqa_folder(tmp_path, tiny_vocab):
    _save(tmp_path / "vqa", vlhub.VlBertForQuestionAnswering, tiny_vocab, answer_slot=True)
    return tmp_path / "vqa"


def test_vl_bert_vqa_pipeline_from_regions(vqa_folder):
    vqa = pipeline("visual-question-answering", model=str(vqa_folder))
    assert isinstance(vqa, VisualQuestionAnsweringPipeline)
    assert isinstance(vqa.model, vlhub.VlBertForQuestionAnswering)
    assert isinstance(vqa.processor, vlhub.VlBertProcessor) and vqa.processor.answer_slot
    regions = [random_regions(n, 16, seed=n) for n in (3, 5, 8)]
    questions = ["what colour is the cat ?", "is the dog on the table ?", "what is red ?"]
    single = vqa_single_and_batched(vqa, regions, questions)
    with torch.no_grad():
        for r, q, answers in zip(regions, questions, single):
            logits = vqa.model(**vqa.processor(text=[q], regions=[r])).logits[0]
            assert [a["answer"] for a in answers] == [ANSWERS[i] for i in logits.topk(3).indices.tolist()]


def test_vl_bert_vqa_pipeline_from_images(vqa_folder, tmp_path):
    processor = AutoProcessor.from_pretrained(vqa_folder)
    processor.region_extractor = tiny_detector()
    processor.save_pretrained(vqa_folder)
    vqa = pipeline("visual-question-answering", model=str(vqa_folder))
    image = write_test_image(tmp_path / "image.png")
    answers = vqa(image=str(image), question="what is red ?", top_k=2)
    regions = vqa.processor.regions_from_images([str(image)])
    with torch.no_grad():
        logits = vqa.model(**vqa.processor(text=["what is red ?"], regions=regions)).logits[0]
    assert [a["answer"] for a in answers] == [ANSWERS[i] for i in logits.topk(2).indices.tolist()]


def test_vl_bert_retrieval_pipeline_is_refused_with_the_reason(tmp_path, tiny_vocab):
    for model_class in (vlhub.VlBertForPreTraining, vlhub.VlBertForQuestionAnswering):
        folder = tmp_path / model_class.__name__
        _save(folder, model_class, tiny_vocab, answer_slot=False)
        with pytest.raises(ValueError, match="VL-BERT has no image-text matching head"):
            pipeline("image-text-retrieval", model=str(folder))
    with pytest.raises(ValueError, match="no 'retrieval' head .*matching head"):
        vlhub.get_architecture("vl_bert").model_class("retrieval")
