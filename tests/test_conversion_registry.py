"""The converter registry, `vlhub convert` built from it, and the generic conversion core on a made-up architecture."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel

from tests.fresh_interpreter import run_python
from vlhub.conversion import registry
from vlhub.conversion.common import (
    CheckpointError,
    ConversionReport,
    KeyMap,
    Provenance,
    convert_state_dict,
    save_converted,
    sha256_of,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_CONVERTERS", dict(registry._CONVERTERS))
    return registry


def _add_arguments(parser):
    parser.add_argument("checkpoint")
    parser.add_argument("--output-dir", required=True)


def test_register_lazy_targets_and_conflicts(clean_registry):
    converter = clean_registry.register_converter(
        "lazy-thing", convert="json:dumps", add_arguments="json:loads", help="a lazily imported converter"
    )
    assert clean_registry.get_converter("lazy-thing") is converter and converter.help == "a lazily imported converter"
    # The same target again (by string or by the callable it names) is a no-op; another target is an error.
    assert (
        clean_registry.register_converter("lazy-thing", convert="json:dumps", add_arguments="json:loads") is converter
    )
    assert clean_registry.register_converter("lazy-thing", convert=json.dumps, add_arguments=json.loads) is converter
    with pytest.raises(ValueError, match="already registered"):
        clean_registry.register_converter("lazy-thing", convert="json:load", add_arguments="json:loads")
    with pytest.raises(ValueError, match=r"no converter named 'nope'.*detector.*lazy-thing.*uniter"):
        clean_registry.get_converter("nope")
    with pytest.raises(TypeError, match="module.path:attribute"):
        clean_registry.register_converter("bad", convert="no_colon", add_arguments=_add_arguments)
    assert {"detector", "uniter", "lazy-thing"} <= set(clean_registry.converters())


def test_registry_imports_nothing_heavy():
    """`import vlhub.conversion` lists every converter (the architectures' included) without importing a modeling
    file, transformers' model/processor/pipeline machinery or torchvision: those come when a converter runs."""
    code = (
        "import sys\n"
        "import vlhub.conversion, vlhub.conversion.registry as r\n"
        "assert {'detector', 'uniter'} <= set(r.converters())\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'torchvision' or m in ("
        "'transformers.modeling_utils', 'transformers.processing_utils', 'transformers.pipelines',"
        " 'vlhub.modeling.uniter.modeling_uniter', 'vlhub.modeling.uniter.convert_uniter'))\n"
        "assert not heavy, heavy[:5]\n"
    )
    run_python(code)  # fails the test with the child's traceback


# ---------------------------------------------------------------------------------------------------- a made-up architecture
class TinyConfig(PreTrainedConfig):
    model_type = "vlhub-tiny-test"

    def __init__(self, vocab_size=10, hidden_size=4, tie_word_embeddings=True, **kwargs):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


class TinyModel(PreTrainedModel):
    config_class = TinyConfig
    base_model_prefix = "tiny"
    _tied_weights_keys = {"out.weight": "embed.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.body = nn.Linear(config.hidden_size, config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.new_head = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.out

    def forward(self, input_ids):
        return self.out(self.body(self.embed(input_ids)))


def original_state(**changes):
    torch.manual_seed(0)
    embed = torch.randn(10, 4)
    state = {
        "net.embed.weight": embed,
        "net.body.gamma": torch.randn(4, 4),
        "net.body.beta": torch.randn(4),
        "net.out.weight": embed.clone(),
        "aux_head.weight": torch.randn(3, 4),
    }
    state.update(changes)
    return state


TINY_MAP = KeyMap(
    renames=[(r"^net\.", ""), (r"\.gamma$", ".weight"), (r"\.beta$", ".bias")],
    drops={r"^aux_head\.": "auxiliary loss head, used only in training"},
)


def test_generic_core_converts_a_made_up_architecture(tmp_path):
    source = original_state()
    model = TinyModel(TinyConfig())
    report = ConversionReport(source="tiny.pt")
    convert_state_dict(source, model, TINY_MAP, report)
    assert report.used == {
        "embed.weight": "net.embed.weight",
        "body.weight": "net.body.gamma",
        "body.bias": "net.body.beta",
    }
    assert report.dropped == {
        "aux_head.weight": "auxiliary loss head, used only in training",
        "net.out.weight": "tied to embed.weight (identical values); re-tied on load",
    }
    assert set(report.initialized) == {"new_head.weight", "new_head.bias"}
    assert model.out.weight is model.embed.weight and torch.equal(model.embed.weight, source["net.embed.weight"])

    checkpoint = tmp_path / "tiny.pt"
    torch.save(source, checkpoint)
    out = save_converted(
        tmp_path / "out",
        model,
        report,
        title="Tiny",
        architecture="tiny",
        provenance=Provenance(checkpoint, "https://github.com/o/tiny", "abc123"),
    )
    assert json.loads((out / "conversion_report.json").read_text())["dropped"] == report.dropped
    card = (out / "README.md").read_text()
    assert sha256_of(checkpoint) in card and "https://github.com/o/tiny" in card and "abc123" in card
    reloaded = TinyModel.from_pretrained(out)
    assert torch.equal(reloaded.body.weight, source["net.body.gamma"])


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"net.mystery.weight": torch.zeros(1)}, "'net.mystery.weight' has no counterpart in TinyModel"),
        ({"net.body.gamma": torch.zeros(4, 5)}, r"'net.body.gamma' has shape \(4, 5\), TinyModel expects \(4, 4\)"),
        ({"net.out.weight": torch.zeros(10, 4)}, "should be tied to 'embed.weight'"),
        ({"body.weight": torch.zeros(4, 4)}, "both map to 'body.weight'"),
    ],
)
def test_generic_core_is_strict(changes, message):
    with pytest.raises(CheckpointError, match=message):
        convert_state_dict(original_state(**changes), TinyModel(TinyConfig()), TINY_MAP, ConversionReport("tiny.pt"))


def test_a_registered_converter_runs_from_the_command_line(clean_registry, tmp_path, capsys):
    from vlhub.cli import main

    def convert(args):
        model = TinyModel(TinyConfig())
        report = ConversionReport(source=Path(args.checkpoint).name)
        convert_state_dict(torch.load(args.checkpoint, weights_only=True), model, TINY_MAP, report)
        save_converted(
            args.output_dir,
            model,
            report,
            title="Tiny",
            architecture="tiny",
            provenance=Provenance(args.checkpoint, "https://github.com/o/tiny", "abc123"),
        )
        return report

    clean_registry.register_converter("tiny-test", convert, _add_arguments, help="a made-up architecture")
    torch.save(original_state(), tmp_path / "tiny.pt")
    assert main(["convert", "tiny-test", str(tmp_path / "tiny.pt"), "--output-dir", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "dropped aux_head.weight: auxiliary loss head" in printed and "newly initialised new_head.bias" in printed
    assert (tmp_path / "out" / "model.safetensors").is_file()
    torch.save(original_state(**{"net.mystery.weight": torch.zeros(1)}), tmp_path / "bad.pt")
    assert main(["convert", "tiny-test", str(tmp_path / "bad.pt"), "--output-dir", str(tmp_path / "bad")]) == 2
    assert "net.mystery.weight" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, extra", [("uniter", {}), ("vl_bert", {}), ("vilbert", {"task_id": 7}), ("unified_vlp", {}), ("tden", {})]
)
def test_architecture_converters_take_the_standard_arguments(name, extra):
    """Every `vlhub convert <architecture>` parses CHECKPOINT --output-dir --config --task --tokenizer --answers (one
    shared definition), plus its own extras (ViLBERT's --task-id)."""
    from vlhub.cli import build_parser

    extra_argv = [str(part) for key, value in extra.items() for part in ("--" + key.replace("_", "-"), value)]
    args = build_parser().parse_args(
        [
            "convert",
            name,
            "ck.bin",
            "--output-dir",
            "out",
            "--config",
            "c.json",
            "--tokenizer",
            "vocab.txt",
            "--answers",
            "answers.json",
            *extra_argv,
        ]
    )
    assert (args.checkpoint, args.output_dir, args.config, args.task, args.tokenizer, args.answers) == (
        "ck.bin",
        "out",
        "c.json",
        None,
        "vocab.txt",
        "answers.json",
    )
    assert {key: getattr(args, key) for key in extra} == extra
    with pytest.raises(SystemExit):  # --output-dir is required
        build_parser().parse_args(["convert", name, "ck.bin"])


def test_converter_command_line_passes_every_argument_on():
    import argparse

    from vlhub.conversion.common import converter_command_line

    calls = []
    add_arguments, convert_from_args = converter_command_line(
        lambda *a, **k: calls.append((a, k)) or "report",
        "toy",
        checkpoint_help="",
        config_help="",
        tasks=["vqa"],
        tokenizer_default="bert",
        answers_help="",
        extra_arguments={"--task-id": dict(type=int)},
    )
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert (
        convert_from_args(parser.parse_args(["ck", "--output-dir", "o", "--task", "vqa", "--task-id", "3"])) == "report"
    )
    assert calls == [(("ck", "o"), dict(config=None, task="vqa", tokenizer="bert", answers=None, task_id=3))]
    with pytest.raises(SystemExit):  # not one of `tasks`
        parser.parse_args(["ck", "--output-dir", "o", "--task", "captioning"])


def test_one_answer_vocabulary_reader_takes_every_form_the_originals_write(tmp_path):
    """`--answers` of every converter: one answer a line, JSON or pickled label2ans lists and ans2label dicts, or
    such a list or dict itself; the count must match a fine-tuned head's, an ans2label dict must index 0..N-1."""
    import pickle

    from vlhub.conversion.common import answer_labels, read_answer_vocabulary

    answers = ["yes", "no", "2"]
    ans2label = {"no": 1, "2": 2, "yes": 0}
    (tmp_path / "answers_vqa.txt").write_text("yes\n no \n\n2\n", encoding="utf-8")
    (tmp_path / "label2ans.json").write_text(json.dumps(answers), encoding="utf-8")
    (tmp_path / "ans2label.json").write_text(json.dumps(ans2label), encoding="utf-8")
    (tmp_path / "trainval_label2ans.pkl").write_bytes(pickle.dumps(answers))
    (tmp_path / "trainval_ans2label.pkl").write_bytes(pickle.dumps(ans2label))
    for form in [*sorted(tmp_path.iterdir()), answers, ans2label]:
        assert read_answer_vocabulary(form) == answers, form
    assert answer_labels(tmp_path / "ans2label.json", 3) == answers
    assert answer_labels(answers, None) == answers  # a new head takes any number
    with pytest.raises(CheckpointError, match="has 3 entries but the head predicts 4 answers"):
        answer_labels(tmp_path / "answers_vqa.txt", 4)
    with pytest.raises(CheckpointError, match="indices 0..N-1"):
        read_answer_vocabulary({"yes": 0, "no": 2})
    (tmp_path / "numbers.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(CheckpointError, match="numbers.json is not an answer list"):
        read_answer_vocabulary(tmp_path / "numbers.json")
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        read_answer_vocabulary(tmp_path / "nope.txt")
