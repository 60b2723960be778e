"""The Unified VLP decoding bench's `--original-checkout` (`bench/vlp_original.py`): the original
`BertForSeq2SeqDecoder`, built from a checkout of LuoweiZhou/VLP, decodes the same captions as vlhub's model given
its weights through vlhub's converter — greedy, and its beam search against `custom_generate=vlp_beam_search`.

Needs a checkout of the original code (never shipped with vlhub): set VLHUB_VLP_CHECKOUT to its path, e.g. after
`git clone https://github.com/LuoweiZhou/VLP`. Without it the comparison is skipped."""

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from vlhub import UnifiedVlpConfig, UnifiedVlpForConditionalGeneration

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_vlp_decoding.py"
CHECKOUT = os.environ.get("VLHUB_VLP_CHECKOUT")
MODELING = "pytorch_pretrained_bert/modeling.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_vlp_decoding", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # also puts bench/ on sys.path
    return module


def tiny_config() -> UnifiedVlpConfig:
    return UnifiedVlpConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=160,
    )


def test_the_bench_refuses_a_folder_that_is_not_a_checkout(monkeypatch, capsys):
    bench = load_bench()
    monkeypatch.setattr(sys, "argv", ["bench_vlp_decoding.py", "--original-checkout", str(Path(__file__).parent)])
    with pytest.raises(SystemExit):
        bench.main()
    assert f"not a checkout of the original Unified VLP code: no {MODELING}" in capsys.readouterr().err


def test_integer_division_floors_only_for_two_integer_operands():
    load_bench()
    import vlp_original

    ids = torch.tensor([0, 4, 7, 9])
    with vlp_original.integer_division_floors():
        assert torch.equal(torch.div(ids, 3), torch.tensor([0, 1, 2, 3]))
        assert torch.equal(torch.div(ids, torch.tensor(3)), torch.tensor([0, 1, 2, 3]))
        assert torch.allclose(torch.div(ids.float(), 2), ids.float() / 2)
        assert torch.allclose(torch.div(ids, 2.0), ids / 2)
    assert torch.div(ids, 3).is_floating_point()  # restored afterwards


@pytest.mark.skipif(
    not CHECKOUT or not (Path(CHECKOUT) / MODELING).is_file(),
    reason="set VLHUB_VLP_CHECKOUT to a checkout of github.com/LuoweiZhou/VLP",
)
def test_original_decoder_gives_vlhubs_captions():
    bench = load_bench()
    import vlp_original

    torch.manual_seed(0)
    config = tiny_config()
    steps = 6
    original = vlp_original.build_original(CHECKOUT, config, beams=1)
    assert type(original).__name__ == "BertForSeq2SeqDecoder" and not original.training
    model = UnifiedVlpForConditionalGeneration(config).eval()
    vlp_original.copy_original_weights(original, model)
    inputs = bench.prompt(config, 3, torch.device("cpu"))
    inputs["region_features"] *= 50  # random tiny weights: large features make the captions depend on the image
    original_inputs = vlp_original.original_inputs(inputs, steps, config)
    prompt_length = inputs["input_ids"].shape[1]
    with torch.no_grad():
        for search, beams in (("greedy", 1), ("vlp-beam", 3)):
            expected = vlp_original.decode_original(original, original_inputs, beams, steps)
            ids = bench.run_like_original(model, inputs, search, beams, steps)[:, prompt_length:]
            assert expected.shape == (3, steps)
            assert torch.equal(bench._zero_after_end(ids, config, search), expected), search


@pytest.mark.skipif(
    not CHECKOUT or not (Path(CHECKOUT) / MODELING).is_file(),
    reason="set VLHUB_VLP_CHECKOUT to a checkout of github.com/LuoweiZhou/VLP",
)
def test_the_original_table_with_its_int8_column_and_profile(monkeypatch, capsys):
    """The whole `--original-checkout --int8 --profile` run on a tiny model: every row has the original, plain, packed
    and int8 columns (int8 captions are counted against fp32's, not required equal); then the first row's packed run
    split by part, with the weight bytes its linear products read and the speed-up they alone allow."""
    bench = load_bench()
    sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    tiny = tiny_config().to_dict()
    monkeypatch.setitem(bench.SIZES, "small", {key: tiny[key] for key in (*sizes, "max_position_embeddings")})
    monkeypatch.setattr(
        sys,
        "argv",
        ["bench_vlp_decoding.py", "--original-checkout", CHECKOUT, "--size", "small", "--int8", "--profile"]
        + [
            "--batch-sizes",
            "2",
            "--searches",
            "greedy",
            "vlp-beam",
            "--beams",
            "2",
            "--new-tokens",
            "3",
            "--repeats",
            "1",
        ],
    )
    bench.main()
    table, profile = capsys.readouterr().out.split("Where vlhub's packed decoding spends its CPU time")
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert "int8 s / image" in rows[0] and rows[1] == "| --- " * 11 + "|" and len(rows) == 4
    parts = [line.strip("|").split("|") for line in profile.splitlines() if line.startswith("| ")][2:]
    assert [part[0].strip() for part in parts][0] == "linear products" and len(parts) == 6
    assert abs(sum(float(part[2].strip(" %")) for part in parts) - 100) <= 3  # rounded shares
    assert re.search(r"read \d+\.\d+ GB of weights per image .* at most \d+\.\d+x the original's", profile)
    for row, search in zip(rows[2:], ("greedy", "vlp-beam")):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 11 and cells[:2] == [search, "2"] and cells[7] == "2/2", row
        assert float(cells[8]) > 0 and cells[9].endswith("x") and cells[10].endswith("/2")


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--profile", "--profile splits the --original-checkout comparison"),
        ("--int8", "--int8 is a column of the --original-checkout table"),
    ],
)
def test_original_table_options_need_the_original_table(monkeypatch, capsys, flag, message):
    bench = load_bench()
    monkeypatch.setattr(sys, "argv", ["bench_vlp_decoding.py", flag])
    with pytest.raises(SystemExit):
        bench.main()
    assert message in capsys.readouterr().err
