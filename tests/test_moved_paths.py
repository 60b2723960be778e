"""Old import paths of code that moved into the architecture folders still work, with a FutureWarning naming the new
home (checked in fresh interpreters: a module's import-time warning fires once per process)."""

from __future__ import annotations

import pytest

from .fresh_interpreter import run_python

ARCHITECTURES = ["uniter", "vl_bert", "vilbert", "unified_vlp", "tden"]


def _run(code: str) -> str:
    # A process that has imported nothing of vlhub or transformers yet (forked from a server that preloaded torch and third-party libraries).
    return run_python(code)


LAYERS_MOVED = {
    "StreamConfig": "vilbert",
    "StreamLayer": "vilbert",
    "cross_stream_mask": "vilbert",
    "CoAttention": "vilbert",
    "CoAttentionOutput": "vilbert",
    "CoAttentionLayer": "vilbert",
    "CrossModalLayer": "tden",
}


@pytest.fixture(scope="module")
def old_paths() -> list[str]:
    # One fresh child for the three tests below: the converter modules' import-time warnings fire once per process and
    # are checked first; the layers' warnings come with each attribute access, the missing names need no fresh process.
    out = _run(
        "import importlib, warnings\n"
        f"for arch in {ARCHITECTURES!r}:\n"
        "    new = importlib.import_module(f'vlhub.modeling.{arch}.convert_{arch}')\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        old = importlib.import_module(f'vlhub.conversion.{arch}')\n"
        "        importlib.import_module(f'vlhub.conversion.{arch}')  # a second import: no second warning\n"
        "    messages = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]\n"
        "    assert len(messages) == 1 and f'vlhub.modeling.{arch}.convert_{arch}' in messages[0], messages\n"
        "    assert set(old.__all__) == set(new.__all__) and old.__all__\n"
        "    assert all(getattr(old, name) is getattr(new, name) for name in new.__all__)\n"
        "    assert old.logger is new.logger  # names outside __all__ too\n"
        "print('ok')\n"
        "import vlhub.conversion.uniter as old\n"
        "try:\n"
        "    old.no_such_name\n"
        "except AttributeError as error:\n"
        "    print('no_such_name' in str(error))\n"
        "import vlhub.modeling.layers as layers\n"
        f"for name, arch in {LAYERS_MOVED!r}.items():\n"
        "    new = importlib.import_module(f'vlhub.modeling.{arch}.layers_{arch}')\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        assert getattr(layers, name) is getattr(new, name)\n"
        "    messages = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]\n"
        "    assert len(messages) == 1 and f'vlhub.modeling.{arch}.layers_{arch}.{name}' in messages[0], messages\n"
        "    assert caught[0].filename == '<string>', caught[0].filename  # points at the caller's line\n"
        "    assert name not in layers.__all__\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('error')\n"
        "    from vlhub.modeling.layers import *  # the remaining shared blocks: no warning\n"
        "try:\n"
        "    layers.NoSuchBlock\n"
        "except AttributeError as error:\n"
        "    print('NoSuchBlock' in str(error))\n"
    )
    return out.split()


def test_old_converter_modules_reexport_the_moved_ones_and_warn_once(old_paths):
    assert old_paths[0] == "ok"


def test_old_converter_module_names_what_it_lacks(old_paths):
    assert old_paths[1] == "True"


def test_single_user_blocks_moved_out_of_layers_keep_their_old_import_path_with_a_warning(old_paths):
    assert old_paths[2:] == ["True"]


TINY = dict(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
TINY_VILBERT = dict(
    visual_hidden_size=16,
    visual_num_hidden_layers=1,
    visual_num_attention_heads=2,
    visual_intermediate_size=16,
    bi_hidden_size=16,
    bi_num_attention_heads=2,
    visual_co_attention_layers=[0],
    text_co_attention_layers=[0],
)
TINY_TDEN = dict(
    num_visual_layers=1,
    num_cross_encoder_layers=1,
    num_decoder_layers=1,
    similarity_pooler_size=8,
    classifier_pooler_size=8,
    bos_token_id=2,
    eos_token_id=3,
    pad_token_id=0,
)


# A fresh child each (~2 s): the fast loop keeps vilbert's layers file; tden's runs in the full suite.
@pytest.mark.parametrize(
    "first",
    ["vlhub.modeling.vilbert.layers_vilbert", pytest.param("vlhub.modeling.tden.layers_tden", marks=pytest.mark.slow)],
)
def test_an_architecture_layers_file_imported_first_still_registers_the_models(first):
    # Tiny configs: which class AutoModel resolves does not depend on the size (full-size models took ~40 CPU-s).
    out = _run(
        f"import {first}\nfrom transformers import AutoModel\nimport vlhub\n"
        f"tiny = {TINY!r}\n"
        f"vilbert = vlhub.VilbertConfig(**tiny, **{TINY_VILBERT!r})\n"
        f"tden = vlhub.TdenConfig(**tiny, **{TINY_TDEN!r})\n"
        "print(AutoModel.from_config(vilbert).__class__.__name__, AutoModel.from_config(tden).__class__.__name__)"
    )
    assert out.split() == ["VilbertModel", "TdenModel"]


def test_build_uniter_config_is_a_deprecated_alias_of_build_config(tmp_path):
    import vlhub
    from tests.training_helpers import TINY_CONFIG, synthetic_corpus, tiny_tokenizer
    from vlhub.registry import get_architecture
    from vlhub.training import build_config, build_uniter_config

    corpus = synthetic_corpus()
    processor = vlhub.UniterProcessor(
        feature_extractor=vlhub.UniterRegionProcessor(region_feature_dim=12), tokenizer=tiny_tokenizer(tmp_path)
    )
    expected = build_config(get_architecture("uniter"), dict(TINY_CONFIG), processor, corpus.sample_regions())
    with pytest.warns(FutureWarning, match=r"build_config\(get_architecture\(\"uniter\"\)"):
        config = build_uniter_config(dict(TINY_CONFIG), processor, corpus.sample_regions())
    assert config.to_dict() == expected.to_dict()
