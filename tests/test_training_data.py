"""Masking (BERT 80/10/10, region masking), objective mixes and the deterministic batch order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.training_helpers import synthetic_corpus, tiny_tokenizer
from vlhub.training import ObjectiveBatchSampler, ObjectiveMix, mask_regions, mask_tokens, objectives_for
from vlhub.training.collators import CaptionDataset, PretrainingCollator
from vlhub.training.masking import random_token_ids


def test_mask_tokens_follows_bert_80_10_10_and_spares_special_tokens():
    batch, length, cls, sep, mask = 400, 20, 2, 3, 4
    input_ids = torch.randint(5, 30, (batch, length))
    input_ids[:, 0], input_ids[:, -1] = cls, sep
    attention = torch.ones_like(input_ids)
    random_ids = torch.arange(5, 30)
    rngs = [np.random.default_rng(i) for i in range(batch)]
    corrupted, labels = mask_tokens(input_ids, attention, [0, 1, cls, sep, mask], mask, random_ids, rngs)
    selected = labels != -100
    assert not selected[:, 0].any() and not selected[:, -1].any()
    assert torch.equal(labels[selected], input_ids[selected])
    assert torch.equal(corrupted[~selected], input_ids[~selected])
    rate = selected.float().mean().item() * length / (length - 2)
    assert 0.13 < rate < 0.17
    became_mask = (corrupted[selected] == mask).float().mean().item()
    kept = (corrupted[selected] == input_ids[selected]).float().mean().item()
    assert 0.76 < became_mask < 0.84 and 0.07 < kept < 0.14  # kept includes random draws of the same id (1/25)


def test_mask_tokens_forces_one_mask_and_regions_mask_at_least_one():
    input_ids = torch.tensor([[2, 7, 8, 3, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 0, 0]])
    corrupted, labels = mask_tokens(
        input_ids, attention, [0, 2, 3, 4], 4, torch.arange(5, 9), [np.random.default_rng(0)], probability=0.0
    )
    assert labels.tolist() == [[-100, 7, -100, -100, -100, -100]] and corrupted[0, 1] == 4
    masks = mask_regions(torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]), [np.random.default_rng(1)] * 2, probability=0.0)
    assert masks.sum(1).tolist() == [1, 1] and not masks[:, 3].any() and masks[1, 0]


def _mask_one_position_at_a_time(
    input_ids, attention, special_ids, mask_id, random_ids, rngs, probability, at_least_one
):
    """The masking rules written out position by position (what `mask_tokens` computes a row at a time)."""
    corrupted, labels = input_ids.clone(), torch.full_like(input_ids, -100)
    for row, rng in enumerate(rngs):
        positions = [
            p for p in range(input_ids.shape[1]) if attention[row, p] and int(input_ids[row, p]) not in special_ids
        ]
        draws = rng.random((len(positions), 3))
        selected = [draw < probability for draw in draws[:, 0]]
        if at_least_one and not any(selected):
            selected[0], draws[0, 1] = True, 0.0
        for k, pos in enumerate(positions):
            if selected[k]:
                labels[row, pos] = input_ids[row, pos]
                if draws[k, 1] < 0.8:
                    corrupted[row, pos] = mask_id
                elif draws[k, 1] < 0.9:
                    corrupted[row, pos] = random_ids[int(draws[k, 2] * len(random_ids))]
    return corrupted, labels


def test_masking_draws_exactly_as_the_rules_written_position_by_position():
    generator = torch.Generator().manual_seed(0)
    for trial in range(40):
        batch, length = 6, 3 + trial
        input_ids = torch.randint(5, 40, (batch, length), generator=generator)
        input_ids[:, 0], input_ids[:, 1] = 2, 9
        attention = (torch.rand(batch, length, generator=generator) < 0.8).long()
        attention[:, :2] = 1
        probability = (0.15, 0.0, 1.0, 0.5)[trial % 4]
        for at_least_one in (True, False):
            got = mask_tokens(
                input_ids,
                attention,
                [0, 2, 3, 4],
                4,
                torch.arange(5, 40),
                [np.random.default_rng([trial, i]) for i in range(batch)],
                probability,
                at_least_one,
            )
            expected = _mask_one_position_at_a_time(
                input_ids,
                attention,
                {0, 2, 3, 4},
                4,
                torch.arange(5, 40),
                [np.random.default_rng([trial, i]) for i in range(batch)],
                probability,
                at_least_one,
            )
            for tensor, reference in zip(got, expected):
                assert tensor.dtype == reference.dtype and torch.equal(tensor, reference)
        counts = torch.randint(1, 9, (batch,), generator=generator)
        region_mask = (torch.arange(8) < counts[:, None]).long()
        masks = mask_regions(region_mask, [np.random.default_rng([trial, i, 1]) for i in range(batch)], probability)
        for row, count in enumerate(counts.tolist()):
            rng = np.random.default_rng([trial, row, 1])
            selected = rng.random(count) < probability
            if not selected.any():
                selected[rng.integers(count)] = True
            assert masks[row].tolist() == selected.tolist() + [False] * (8 - count)
    assert masks.dtype == torch.bool


def test_random_tokens_exclude_special_and_unused_entries(tmp_path):
    tokenizer = tiny_tokenizer(tmp_path)
    ids = set(random_token_ids(tokenizer).tolist())
    assert not ids & set(tokenizer.all_special_ids) and len(ids) == len(tokenizer) - 5


def test_objective_mix_parsing_and_errors():
    available = objectives_for("uniter")
    mix = ObjectiveMix.parse(["mlm:2", "mrfr", "wra:0.5"], available)
    assert mix.as_dict() == {"mlm": 2.0, "mrfr": 1.0, "wra": 0.5}
    assert mix.objectives["wra"].model_objective == "itm-wra"
    for bad, message in (
        (["nsp:1"], "unknown objective"),
        (["mlm:0"], "positive"),
        (["mlm:x"], "name:ratio"),
        (["mlm", "mlm:2"], "twice"),
    ):
        with pytest.raises(ValueError, match=message):
            ObjectiveMix.parse(bad, available)


def test_batch_order_is_a_function_of_seed_and_epoch_with_one_objective_per_group():
    mix = ObjectiveMix({"mlm": 3, "itm": 1}, objectives_for("uniter"))
    sampler = ObjectiveBatchSampler(1000, 5, mix, seed=7, group_size=4)
    assert len(sampler) == 200 and sampler.steps_per_epoch == 50
    first = list(sampler)
    assert first == list(ObjectiveBatchSampler(1000, 5, mix, seed=7, group_size=4))
    sampler.set_epoch(1)
    assert list(sampler) != first
    objectives = [batch[0].objective for batch in first]
    for group in range(0, len(first), 4):
        assert len(set(objectives[group : group + 4])) == 1
        assert all(len({k.objective for k in batch}) == 1 for batch in first[group : group + 4])
    share = objectives[::4].count("mlm") / 50
    assert 0.55 < share < 0.95  # 3:1
    indices = sorted(k.index for batch in first for k in batch)
    assert indices == list(range(1000))  # a permutation: every example once per epoch


def test_collator_targets_line_up_with_the_selected_regions(tmp_path):
    import vlhub

    corpus = synthetic_corpus()
    processor = vlhub.UniterProcessor(
        feature_extractor=vlhub.UniterRegionProcessor(region_feature_dim=12), tokenizer=tiny_tokenizer(tmp_path)
    )
    objectives = objectives_for("uniter")
    collator = PretrainingCollator(processor, corpus.regions, objectives)
    mix = ObjectiveMix({"mrc-kl": 1}, objectives)
    keys = next(iter(ObjectiveBatchSampler(len(corpus.train), 6, mix, seed=0)))
    examples = [CaptionDataset(corpus.train)[k] for k in keys]
    batch = collator(examples)
    assert batch["objective"] == "mrc-kl"
    expected = torch.cat(
        [
            corpus.regions[e["image_id"]].class_probs[batch["region_masks"][i, : len(corpus.regions[e["image_id"]])]]
            for i, e in enumerate(examples)
        ]
    )
    assert torch.equal(batch["region_class_targets"], expected)
    again = collator(examples)
    assert torch.equal(again["region_masks"], batch["region_masks"])  # masking is a function of the keys
    itm = collator([{**e, "objective": "itm"} for e in examples] * 4)
    assert set(itm["itm_labels"].tolist()) == {0, 1}
    # The contrastive extension: matched pairs only, two captions of one image share an id.
    itc = collator([{**e, "objective": "itc"} for e in examples[:3]] + [{**examples[0], "objective": "itc"}])
    assert itc["objective"] == "itc" and "itm_labels" not in itc
    ids = itc["itc_image_ids"].tolist()
    image_ids = [e["image_id"] for e in examples[:3]] + [examples[0]["image_id"]]
    assert [ids[i] == ids[j] for i in range(4) for j in range(4)] == [
        image_ids[i] == image_ids[j] for i in range(4) for j in range(4)
    ]


def test_the_region_cache_is_bounded_in_bytes_and_workers_start_empty(tmp_path):
    import pickle

    from tests.helpers import random_regions
    from vlhub.training.data import RegionCache

    class CountingStore(dict):
        reads = 0

        def __getitem__(self, key):
            CountingStore.reads += 1
            return dict.__getitem__(self, key)

    store = CountingStore({f"img{i}": random_regions(4, 16, seed=i) for i in range(10)})
    one_image = 4 * 16 * 4 + 4 * 4 * 4 + 4 * 4  # features + boxes + scores, float32
    cache = RegionCache(store, max_bytes=3 * one_image)
    for image_id in ["img0", "img1", "img2", "img0", "img3"]:  # img1 is the least recently used when img3 comes
        cache[image_id]
    assert cache.cached_bytes <= 3 * one_image
    assert list(cache._cache) == ["img2", "img0", "img3"]
    reads = CountingStore.reads
    cache["img0"], cache["img3"]
    assert CountingStore.reads == reads  # hits
    cache["img1"]
    assert CountingStore.reads == reads + 1  # evicted, read again
    for image_id in store:
        cache[image_id]
    assert cache.cached_bytes <= 3 * one_image
    cache.store = dict(store)  # a picklable store (the class above is local to this test)
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.cached_bytes == 0 and not copy._cache and len(copy) == 10
    assert len(RegionCache(store, max_bytes=0)._cache) == 0


def test_only_a_store_that_fits_in_the_region_cache_is_cached(tmp_path):
    from tests.helpers import random_regions
    from vlhub.processing.stores import RegionStore, RegionStoreWriter
    from vlhub.training.data import RegionCache, open_region_source

    with RegionStoreWriter(tmp_path / "store") as writer:
        for i in range(8):
            writer.add(f"img{i}", random_regions(36, 2048, seed=i))  # 8 x 295 kB of float32 features on disk
    assert isinstance(open_region_source(tmp_path / "store", cache_mb=16), RegionCache)
    bare = open_region_source(tmp_path / "store", cache_mb=1)  # a 1 MiB cache would hold 3 of the 8 images
    assert isinstance(bare, RegionStore)
    torch.testing.assert_close(bare["img3"].features, random_regions(36, 2048, seed=3).features, atol=0, rtol=0)
    assert isinstance(open_region_source(tmp_path / "store", cache_mb=0), RegionCache)  # caching off, as asked


def test_workers_send_float16_exact_region_features_as_float16():
    from vlhub.training.collators import Float16RegionTransfer

    exact = torch.randn(2, 3, 8).half().float()
    inexact = exact.clone()
    inexact[1, 2, 5] += 1e-4  # between two float16 values
    huge = exact.clone()
    huge[0, 0, 0] = 1e5  # beyond float16's range
    for features, sent_as in ((exact, torch.float16), (inexact, torch.float32), (huge, torch.float32)):
        batch = Float16RegionTransfer(lambda examples: {"region_features": features.clone(), "labels": examples})(
            [1, 2]
        )
        assert batch["region_features"].dtype == sent_as and batch["labels"] == [1, 2]
        torch.testing.assert_close(batch["region_features"].float(), features, atol=0, rtol=0)
    assert Float16RegionTransfer(lambda examples: {"input_ids": torch.ones(2, 3)})([]).keys() == {"input_ids"}
    # Compared bit for bit whatever the layout (an odd last dimension, a transposed view): one inexact value is seen.
    for exact in (torch.randn(2, 3, 7).half().float(), torch.randn(2, 8, 3).half().float().transpose(1, 2)):
        for position in ((0, 0, 0), (1, 2, 6)):
            inexact = exact.clone()
            inexact[position] = torch.nextafter(inexact[position], torch.tensor(10.0))
            for features, sent_as in ((exact, torch.float16), (inexact, torch.float32)):
                batch = Float16RegionTransfer(lambda examples: {"region_features": features})([])
                assert batch["region_features"].dtype == sent_as
                assert torch.equal(batch["region_features"].float(), features)


def test_features_a_float16_store_gave_unchanged_are_sent_as_float16_without_a_check(tmp_path, monkeypatch):
    """UNITER's processor marks the `region_features` of a float16 store's rows (passed through unchanged) as float16
    exact, and the workers' transfer then sends them as float16 without comparing: the same bits as the checked
    path. A float32 store, an architecture that adds rows (ViLBERT's global row), or a change in place gets no mark
    (or loses it), and the values are checked as before."""
    from tests.helpers import random_regions
    from vlhub.processing.regions import marked_float16_exact
    from vlhub.processing.stores import RegionStore, RegionStoreWriter
    from vlhub.registry import get_architecture
    from vlhub.training import collators
    from vlhub.training.collators import Float16RegionTransfer

    tokenizer = tiny_tokenizer(tmp_path)
    images = [random_regions(5 + i, 16, seed=i) for i in range(3)]
    for dtype in ("float16", "float32"):
        with RegionStoreWriter(tmp_path / dtype, feature_dtype=dtype) as writer:
            for i, regions in enumerate(images):
                writer.add(str(i), regions)
    read = {dtype: [RegionStore(tmp_path / dtype)[str(i)] for i in range(3)] for dtype in ("float16", "float32")}
    texts = ["a red circle", "two squares", "a blue triangle"]
    uniter = get_architecture("uniter").build_processor(tokenizer, 16, min_regions=1)
    vilbert = get_architecture("vilbert").build_processor(tokenizer, 16, min_regions=1)
    marked = uniter(text=texts, regions=read["float16"])["region_features"]
    assert marked_float16_exact(marked)
    assert not marked_float16_exact(uniter(text=texts, regions=read["float32"])["region_features"])
    assert not marked_float16_exact(vilbert(text=texts, regions=read["float16"])["region_features"])

    unmarked = marked.clone()
    checked = Float16RegionTransfer(lambda examples: {"region_features": unmarked})([])["region_features"]
    monkeypatch.setattr(collators, "_same_bits", lambda a, b: pytest.fail("a marked batch was compared"))
    sent = Float16RegionTransfer(lambda examples: {"region_features": marked})([])["region_features"]
    assert sent.dtype == checked.dtype == torch.float16 and torch.equal(
        sent.view(torch.int16), checked.view(torch.int16)
    )

    marked[0, 0, 0] += 1e-4  # between two float16 values: the mark is void
    assert not marked_float16_exact(marked)
    monkeypatch.undo()
    assert (
        Float16RegionTransfer(lambda examples: {"region_features": marked})([])["region_features"].dtype
        == torch.float32
    )


def _batch_of_many_kinds(examples):
    generator = torch.Generator().manual_seed(int(examples[0]))
    return {
        "input_ids": torch.randint(0, 100, (4, 7), generator=generator),
        "region_masks": torch.rand(4, 5, generator=generator) < 0.5,
        "region_locations": torch.rand(4, 5, 7, generator=generator),
        "half": torch.rand(3, 2, generator=generator).half(),
        "empty": torch.zeros(0, 3, dtype=torch.long),
        "strided": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous: shared as before
        "large": torch.rand(300, 200, generator=generator),  # above the bound: shared memory as before
        "objective": "mlm",
        "examples": list(examples),
    }


def test_workers_send_small_tensors_inside_the_batch_and_the_main_process_gets_the_same_batch():
    from torch.utils.data import DataLoader

    from vlhub.training.collators import InlineSmallTensors

    def batches(num_workers):
        collate = InlineSmallTensors(_batch_of_many_kinds) if num_workers else _batch_of_many_kinds
        return list(DataLoader(list(range(12)), batch_size=3, num_workers=num_workers, collate_fn=collate))

    direct, through_workers = batches(0), batches(2)
    assert len(direct) == len(through_workers) == 4
    for expected, got in zip(direct, through_workers):
        assert list(got) == list(expected)
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert type(got[key]) is torch.Tensor and got[key].dtype == value.dtype, key
                assert got[key].shape == value.shape and torch.equal(got[key], value), key
                got[key].fill_(0)  # ordinary writable tensors
            else:
                assert got[key] == value
    wrapped = InlineSmallTensors(_batch_of_many_kinds)([0])
    assert {key for key, value in wrapped.items() if isinstance(value, torch.Tensor)} == {"strided", "large"}


def test_process_resources_for_training():
    import resource
    import sys

    from vlhub.utils.resources import open_file_limit, raise_open_file_limit, retain_freed_memory

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        assert raise_open_file_limit() == open_file_limit() == (None if hard == resource.RLIM_INFINITY else hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if sys.platform.startswith("linux"):
        import ctypes

        glibc = hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
        assert retain_freed_memory() is glibc


@pytest.mark.parametrize("model_type", ["uniter", "vl_bert", "vilbert", "unified_vlp", "tden"])
def test_every_model_reads_float16_region_features_as_the_same_float32_values(tmp_path, model_type):
    """What `Float16RegionTransfer` relies on: a model given float16-exact region features as float16 computes
    exactly what it computes from them as float32 (every model casts them to its own dtype first)."""
    from tests.training_helpers import synthetic_corpus, tiny_tokenizer
    from vlhub.training.pretraining import build_pretraining_model

    corpus = synthetic_corpus()
    torch.manual_seed(0)
    model, processor = build_pretraining_model(None, "tiny", tiny_tokenizer(tmp_path), corpus, model_type=model_type)
    base = model.base_model.eval()
    pairs = corpus.train[:3]
    inputs = dict(
        processor(text=[c for _, c in pairs], regions=[corpus.regions[i] for i, _ in pairs], return_tensors="pt")
    )
    inputs["region_features"] = inputs["region_features"].half().float()
    with torch.no_grad():
        as_float32 = base(**inputs)
        as_float16 = base(**{**inputs, "region_features": inputs["region_features"].half()})
    compared = [
        name for name, value in as_float32.items() if isinstance(value, torch.Tensor) and value.is_floating_point()
    ]
    assert compared, "the base model returned no float outputs to compare"
    for name in compared:
        assert as_float16[name].dtype == as_float32[name].dtype, name
        torch.testing.assert_close(as_float16[name], as_float32[name], atol=0, rtol=0, msg=name)
