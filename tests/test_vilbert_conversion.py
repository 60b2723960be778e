"""ViLBERT converter behaviour beyond the numbers (tests/test_vilbert_parity.py): key accounting with reasons, the
weight-norm folding, provenance, Auto classes on converted folders, and clear errors."""

import json

import pytest
import torch
from transformers import AutoModel, AutoModelForVisualQuestionAnswering, AutoProcessor

import vlhub
from vlhub.cli import main as cli_main
from vlhub.conversion.common import CheckpointError, sha256_of
from vlhub.modeling.vilbert.convert_vilbert import convert_vilbert

from .conftest import fixtures_root, write_vocab
from .release_files import vilbert_files

ROOT = fixtures_root() / "vilbert"
ORIGINAL = ROOT / "original"
pytestmark = pytest.mark.skipif(not ORIGINAL.is_dir(), reason="no ViLBERT fixture")
if ORIGINAL.is_dir():  # found as the original finds them, whatever the fixture set names them
    FILES = vilbert_files(ORIGINAL)
    CONFIG = FILES["config"]
    PRETRAINED, BETA_VQA, MULTI_TASK = (FILES["checkpoints"][role] for role in ("pretrain", "beta_vqa", "mt"))


@pytest.fixture
def vocab(tmp_path):
    size = json.loads(CONFIG.read_text())["vocab_size"]
    return write_vocab(
        tmp_path / "vocab.txt", size, {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
    )


def test_every_key_accounted_for_with_reasons_and_provenance(tmp_path, vocab):
    report = convert_vilbert(PRETRAINED, tmp_path / "out", config=CONFIG, tokenizer=vocab)
    keys = set(torch.load(PRETRAINED, weights_only=True))
    assert set(report.used.values()) | set(report.dropped) == keys and not report.initialized
    q_dense = {k for k in keys if ".q_dense" in k}
    assert q_dense and all("never used" in report.dropped[k] for k in q_dense)
    assert "tied to" in report.dropped["cls.predictions.decoder.weight"]
    assert set(report.dropped) == q_dense | {"cls.predictions.decoder.weight"}
    card = (tmp_path / "out" / "README.md").read_text()
    assert sha256_of(PRETRAINED) in card and "jiasenlu/vilbert_beta" in card and PRETRAINED.name in card
    assert json.loads((tmp_path / "out" / "conversion_report.json").read_text())["dropped"] == report.dropped


def test_beta_weight_norm_is_folded(tmp_path, vocab):
    convert_vilbert(BETA_VQA, tmp_path / "vqa", config=CONFIG, tokenizer=vocab)
    source = torch.load(BETA_VQA, weights_only=True)
    model = AutoModelForVisualQuestionAnswering.from_pretrained(tmp_path / "vqa")
    assert isinstance(model, vlhub.VilbertForQuestionAnswering) and model.config.classifier_type == "beta"
    for index in (0, 3):
        layer = torch.nn.Linear(*reversed(source[f"vil_prediction.main.{index}.weight_v"].shape))
        layer = torch.nn.utils.parametrizations.weight_norm(layer, dim=None)
        with torch.no_grad():
            layer.parametrizations.weight.original0.copy_(source[f"vil_prediction.main.{index}.weight_g"])
            layer.parametrizations.weight.original1.copy_(source[f"vil_prediction.main.{index}.weight_v"])
        torch.testing.assert_close(model.vil_prediction[index].weight, layer.weight, atol=1e-7, rtol=1e-6)
    assert model.config.num_labels == source["vil_prediction.main.3.weight_v"].shape[0]


def test_beta_num_labels_disagreeing_with_the_config_is_refused(tmp_path, vocab):
    config = {**json.loads(CONFIG.read_text()), "num_labels": 10}
    with pytest.raises(CheckpointError, match="num_labels=10 but the checkpoint's answer head predicts"):
        convert_vilbert(BETA_VQA, tmp_path / "vqa", config=config, tokenizer=vocab)
    with pytest.raises(CheckpointError, match="answer vocabulary has 2 entries"):
        convert_vilbert(BETA_VQA, tmp_path / "vqa", config=CONFIG, tokenizer=vocab, answers=["yes", "no"])


def test_config_disagreeing_with_the_checkpoint_is_refused(tmp_path, vocab):
    visual = json.loads(CONFIG.read_text())["v_hidden_size"]
    config = {**json.loads(CONFIG.read_text()), "v_hidden_size": visual * 2}
    with pytest.raises(CheckpointError, match=f"v_hidden_size={visual * 2} but the checkpoint has {visual}"):
        convert_vilbert(PRETRAINED, tmp_path / "x", config=config, tokenizer=vocab)
    config = {**json.loads(CONFIG.read_text()), "task_specific_tokens": False}
    with pytest.raises(CheckpointError, match="task-token embeddings"):
        convert_vilbert(MULTI_TASK, tmp_path / "x", config=config, tokenizer=vocab)


def test_a_task_the_checkpoint_has_no_head_for_is_refused(tmp_path, vocab):
    with pytest.raises(CheckpointError, match="vil_tri_prediction"):
        convert_vilbert(BETA_VQA, tmp_path / "ve", config=CONFIG, task="ve", tokenizer=vocab)
    with pytest.raises(CheckpointError, match="vil_prediction"):
        convert_vilbert(PRETRAINED, tmp_path / "vqa", config=CONFIG, task="vqa", tokenizer=vocab)


def test_not_a_vilbert_checkpoint(tmp_path, vocab):
    torch.save({"uniter.embeddings.word_embeddings.weight": torch.zeros(3, 2)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a ViLBERT checkpoint"):
        convert_vilbert(tmp_path / "other.pt", tmp_path / "x", tokenizer=vocab)
    (tmp_path / "truncated.bin").write_bytes(PRETRAINED.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="truncated"):
        convert_vilbert(tmp_path / "truncated.bin", tmp_path / "x", tokenizer=vocab)


def test_multi_task_folder_other_heads_dropped_and_task_id_required(tmp_path, vocab):
    report = convert_vilbert(MULTI_TASK, tmp_path / "gqa", config=CONFIG, task="gqa", tokenizer=vocab)
    assert report.used["vil_prediction.3.weight"] == "vil_prediction_gqa.logit_fc.3.weight"
    assert "VQA answer head" in report.dropped["vil_prediction.logit_fc.3.weight"]
    assert "another task" in report.dropped["vil_tri_prediction.weight"]
    assert "never reads them" in report.dropped["cls.bi_seq_relationship.weight"]
    model = AutoModel.from_pretrained(tmp_path / "gqa")
    processor = AutoProcessor.from_pretrained(tmp_path / "gqa")
    assert processor.task_id == 15 and model.config.num_task_tokens == processor.num_task_tokens
    regions = vlhub.RegionFeatures(torch.rand(3, 2048), torch.tensor([[0.0, 0, 5, 5]] * 3), (10, 10))
    inputs = processor(token_ids=[[5, 6]], regions=[regions])
    assert inputs["task_ids"].tolist() == [[15]]
    with torch.no_grad():
        model(**inputs)
        with pytest.raises(ValueError, match="pass task_ids"):
            model(**{k: v for k, v in inputs.items() if k != "task_ids"})
        with pytest.raises(ValueError, match="out of range"):
            model(**{**inputs, "task_ids": torch.tensor([[model.config.num_task_tokens]])})


def test_zero_shot_retrieval_from_a_pretrained_checkpoint(tmp_path, vocab):
    report = convert_vilbert(PRETRAINED, tmp_path / "zs", config=CONFIG, task="retrieval", tokenizer=vocab)
    assert report.used["vil_logit.weight"].startswith("cls.bi_seq_relationship.weight")
    source = torch.load(PRETRAINED, weights_only=True)
    model = vlhub.VilbertForImageTextRetrieval.from_pretrained(tmp_path / "zs")
    weight = source["cls.bi_seq_relationship.weight"]
    assert torch.equal(model.vil_logit.weight[0], weight[0] - weight[1])


def test_save_load_is_exact_and_the_command_line_converts(tmp_path, vocab):
    # `vlhub convert`'s own `main`, in this process (the other architectures' tests start `python -m vlhub.cli`).
    command = ["convert", "vilbert", str(MULTI_TASK), "--output-dir", str(tmp_path / "cli"), "--config", str(CONFIG)]
    assert cli_main([*command, "--task", "ve", "--tokenizer", str(vocab)]) == 0
    model = vlhub.VilbertForVisualEntailment.from_pretrained(tmp_path / "cli")
    model.save_pretrained(tmp_path / "again")
    again = vlhub.VilbertForVisualEntailment.from_pretrained(tmp_path / "again")
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_answer_vocabulary_from_the_original_pickle(tmp_path, vocab):
    import pickle

    num_labels = torch.load(BETA_VQA, weights_only=True)["vil_prediction.main.3.weight_v"].shape[0]
    answers = [f"answer {i}" for i in range(num_labels)]
    (tmp_path / "trainval_label2ans.pkl").write_bytes(pickle.dumps(answers))
    (tmp_path / "trainval_ans2label.pkl").write_bytes(pickle.dumps({a: i for i, a in enumerate(answers)}))
    for name in ("trainval_label2ans.pkl", "trainval_ans2label.pkl"):
        convert_vilbert(BETA_VQA, tmp_path / f"out-{name}", config=CONFIG, tokenizer=vocab, answers=tmp_path / name)
        config = vlhub.VilbertConfig.from_pretrained(tmp_path / f"out-{name}")
        assert config.id2label[5] == "answer 5" and config.label2id["answer 7"] == 7


def test_multi_task_pointing_tasks_and_untrained_task_ids(tmp_path, vocab):
    """Visual7w / GuessWhat pointing (12-in-1 "V-logit-mc") convert to the referring-expression head with their task
    ids; a task id the released 12-in-1 model was not trained on (GuessWhat 14, VCR 5) is converted with a note."""
    report = convert_vilbert(MULTI_TASK, tmp_path / "v7w", config=CONFIG, task="visual7w", tokenizer=vocab)
    assert report.used["vision_logit.weight"] == "vision_logit.weight"
    # The head scores regions from the visual stream alone: what only the text output reads is dropped, with why.
    config = vlhub.VilbertConfig.from_pretrained(tmp_path / "v7w")
    last, tail = config.num_co_attention_layers - 1, config.text_co_attention_layers[-1]
    for key in (
        "linguisic_logit.weight",
        "bert.t_pooler.dense.weight",
        "bert.v_pooler.dense.weight",
        f"bert.encoder.layer.{tail}.output.dense.weight",
        f"bert.encoder.c_layer.{last}.biattention.query2.weight",
        f"bert.encoder.c_layer.{last}.t_output.dense.weight",
    ):
        assert "visual stream alone" in report.dropped[key] or "no task's loss" in report.dropped[key], key
    assert report.used[f"vilbert.encoder.c_layer.{last}.biattention.query1.weight"]
    assert not report.initialized
    assert AutoProcessor.from_pretrained(tmp_path / "v7w").task_id == 4
    assert not any("not one the released" in note for note in report.notes)
    assert isinstance(AutoModel.from_pretrained(tmp_path / "v7w"), vlhub.VilbertModel)
    report = convert_vilbert(MULTI_TASK, tmp_path / "guesswhat", config=CONFIG, task="ve", task_id=14, tokenizer=vocab)
    assert any("task id 14 is not one the released 12-in-1 model was trained on" in note for note in report.notes)


def test_the_processor_gets_the_original_text_length_of_each_task(tmp_path, vocab):
    # vilbert_tasks.yml's max_seq_length (12-in-1 task numbers), the beta ymls', 36 for pre-training.
    for checkpoint, task, task_id, expected in (
        (MULTI_TASK, "vqa", None, 23),
        (MULTI_TASK, "visual7w", None, 20),
        (MULTI_TASK, "guesswhat_pointing", None, 256),
        (MULTI_TASK, "vcr", 6, 80),
        (BETA_VQA, "vqa", None, 16),
        (PRETRAINED, None, None, 36),
    ):
        folder = tmp_path / f"{task}-{task_id}-{checkpoint.parent.name}"
        report = convert_vilbert(checkpoint, folder, config=CONFIG, task=task, task_id=task_id, tokenizer=vocab)
        assert AutoProcessor.from_pretrained(folder).max_text_length == expected, (task, task_id)
        assert f"processor max_text_length {expected}" in " ".join(report.notes)
