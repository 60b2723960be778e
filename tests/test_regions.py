import numpy as np
import pytest
import torch

from vlhub import RegionFeatures
from vlhub.processing.processor_base import select_regions


def make(**overrides):
    fields = dict(
        features=torch.rand(3, 8),
        boxes=torch.tensor([[0.0, 0.0, 10.0, 10.0], [5.0, 5.0, 20.0, 15.0], [1.0, 2.0, 3.0, 4.0]]),
        image_size=(20, 30),
    )
    fields.update(overrides)
    return RegionFeatures(**fields)


def test_region_features_accepts_numpy_and_stores_float32():
    regions = make(features=np.ones((3, 8), dtype=np.float16), scores=[0.9, 0.5, 0.1])
    assert regions.features.dtype == torch.float32 and regions.scores.dtype == torch.float32
    assert len(regions) == 3 and regions.feature_dim == 8 and regions.image_size == (20, 30)
    assert torch.allclose(regions.normalized_boxes()[1], torch.tensor([5 / 30, 5 / 20, 20 / 30, 15 / 20]))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"features": torch.rand(0, 8), "boxes": torch.zeros(0, 4)}, "at least one region"),
        ({"features": torch.rand(3)}, "2 dimensions"),
        ({"boxes": torch.rand(2, 4)}, "shape (3, 4)"),
        ({"boxes": torch.tensor([[5.0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]])}, "x2 >= x1"),
        ({"boxes": torch.tensor([[0.0, 0, 1, 1], [0, 0, 31, 1], [0, 0, 1, 1]])}, "inside the image"),
        ({"boxes": torch.tensor([[0.0, -3, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]])}, "inside the image"),
        ({"features": torch.tensor([[float("nan")] * 8] * 3)}, "NaN"),
        ({"image_size": (0, 30)}, "positive"),
        ({"image_size": 30}, "(height, width)"),
        ({"scores": torch.rand(2)}, "scores has 2 rows"),
        ({"class_probs": torch.rand(3)}, "2 dimensions"),
        ({"features": "abc"}, "must be a tensor or array"),
        ({"features": torch.ones(3, 8, dtype=torch.bool)}, "must hold numbers"),
    ],
)
def test_region_features_rejects_bad_input(overrides, message):
    with pytest.raises((ValueError, TypeError), match=None) as info:
        make(**overrides)
    assert message in str(info.value)


def test_select_orders_by_confidence_and_clamps():
    regions = make(features=torch.arange(24.0).view(3, 8), scores=torch.tensor([0.1, 0.9, 0.5]))
    chosen = select_regions(regions, confidence_threshold=0.2, min_regions=1, max_regions=10)
    assert chosen.scores.tolist() == pytest.approx([0.9, 0.5])  # 2 above 0.2, by confidence
    assert torch.equal(chosen.features[0], regions.features[1])
    assert len(select_regions(regions, 0.2, min_regions=3, max_regions=10)) == 3  # min clamp keeps the weak one
    assert len(select_regions(regions, 0.0, min_regions=1, max_regions=1)) == 1  # max clamp


def test_selection_equals_the_torch_sort_formula_with_ties_zeros_and_scores_at_the_threshold():
    """Selection sorts in numpy; it picks what `torch.sort(descending=True, stable=True)` and a float32 comparison
    with the threshold pick: ties keep their order, -0.0 ties 0.0, a score equal to float32(threshold) is not
    above it."""
    generator = torch.Generator().manual_seed(0)
    for trial in range(300):
        count = int(torch.randint(1, 30, (1,), generator=generator))
        pool = torch.tensor([0.0, -0.0, 0.2, 0.1, 0.5, 0.7, 1.0], dtype=torch.float32)
        scores = pool[torch.randint(0, len(pool), (count,), generator=generator)]
        if trial % 2:
            scores = torch.rand(count, generator=generator)
        threshold, low, high = [(0.2, 10, 100), (0.1, 1, 5), (0.0, 3, None), (0.5, 1, 100)][trial % 4]
        regions = RegionFeatures(torch.arange(count * 2.0).view(count, 2), torch.zeros(count, 4), (4, 4), scores=scores)
        order = torch.sort(scores, descending=True, stable=True).indices
        keep = min(max(int((scores > threshold).sum()), low), high or count, count)
        chosen = select_regions(regions, threshold, low, high)
        if keep == count and torch.equal(order, torch.arange(count)):
            assert chosen is regions
        else:
            assert torch.equal(chosen.features, regions.features[order[:keep]]), trial
            assert torch.equal(chosen.scores, scores[order[:keep]]), trial


def test_select_without_scores_refuses_to_cut():
    regions = make()
    assert select_regions(regions, 0.2, 1, 3) is regions
    with pytest.raises(ValueError, match="at most max_regions=2"):
        select_regions(regions, 0.2, 1, 2)


def test_round_trip_through_dict_and_normalised_constructor():
    regions = make(scores=torch.tensor([0.3, 0.2, 0.1]))
    again = RegionFeatures.from_dict(regions.to_dict())
    assert torch.equal(again.boxes, regions.boxes) and again.image_size == regions.image_size
    normalised = RegionFeatures.from_normalized_boxes(regions.features, regions.normalized_boxes(), image_size=(20, 30))
    assert torch.allclose(normalised.boxes, regions.boxes)
    unit = RegionFeatures.from_normalized_boxes(regions.features, regions.normalized_boxes())
    assert unit.image_size == (1, 1)
    with pytest.raises(KeyError, match="missing"):
        RegionFeatures.from_dict({"features": regions.features})
