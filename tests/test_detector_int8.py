"""The detector's opt-in int8 res5 (`RegionExtractor.quantize`): close to float32, batch-independent, refusals."""

from __future__ import annotations

import pytest
import torch

from .helpers import tiny_detector, write_test_image


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    return [str(write_test_image(folder / f"{i}.png", 56 + 4 * i, 80 - 4 * i, seed=20 + i)) for i in range(6)]


def test_int8_res5_stays_close_to_float32_and_ignores_the_batch(images):
    reference = tiny_detector(seed=3)
    quantized = tiny_detector(seed=3).quantize(images[:3])
    assert quantized.quantization == "int8"
    assert isinstance(quantized.roi_heads.res5.blocks[0].conv2, torch.ao.nn.intrinsic.quantized.ConvReLU2d)
    with torch.inference_mode():
        prepared = reference.prepare(images[3:])
        proposals, float_outputs = reference.run_heads(prepared)
        res4 = [quantized.backbone_features(item) for item in prepared]
        int8_outputs = quantized.roi_heads(res4, proposals)
    for float_head, int8_head in zip(float_outputs, int8_outputs):
        error = (int8_head.features - float_head.features).norm() / float_head.features.norm()
        assert 0 < error < 0.05  # measured ~0.01 on this tiny network
    # Fixed int8 scales: a region's feature depends on its own RoI only, so a batch gives exactly what single
    # images give (the RoI head mixes RoIs of several images in one res5 pass).
    together = quantized.detect(images[3:])
    for image, batched in zip(images[3:], together):
        alone = quantized.detect(image)[0]
        assert torch.equal(alone.features, batched.features)
        assert torch.equal(alone.proposal_indices, batched.proposal_indices)


def test_int8_refusals(images, tmp_path):
    extractor = tiny_detector(seed=4)
    with pytest.raises(ValueError, match="only 'int8'"):
        extractor.quantize(images[:1], dtype="int4")
    with pytest.raises(ValueError, match="no images given"):
        extractor.quantize([])
    with pytest.raises(ValueError, match="quantize a float32 extractor"):
        tiny_detector(seed=4).to(torch.bfloat16).quantize(images[:1])
    extractor.quantize(images[:1])
    with pytest.raises(ValueError, match="already quantized"):
        extractor.quantize(images[:1])
    with pytest.raises(ValueError, match="cannot be saved"):
        extractor.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()


@pytest.mark.parametrize(
    "capabilities, expected",
    [
        ({"avx512_vnni": True}, (0, 255)),
        ({"avx_vnni": True}, (0, 255)),
        ({"amx_int8": True}, (0, 255)),
        ({"avx2": True, "avx512_bw": True}, (0, 127)),  # int16 pair sums: 7 bits keep them from saturating
        ({}, (0, 127)),
    ],
)
def test_activation_range_follows_the_int8_dot_product_units(monkeypatch, capabilities, expected):
    from vlhub.processing.detector.quantization import activation_range

    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: dict(capabilities))
    assert activation_range() == expected


def test_the_full_range_halves_the_activation_steps(monkeypatch, images):
    """The range chosen is the one calibrated: the same RoIs give ~255/127 finer activation steps with all 8 bits."""
    scales = {}
    for flag in ("avx512_vnni", "avx2"):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda flag=flag: {flag: True})
        quantized = tiny_detector(seed=3).quantize(images[:2])
        scales[flag] = quantized.roi_heads.res5.blocks[0].conv2.scale
    assert 0.3 < scales["avx512_vnni"] / scales["avx2"] < 0.75
