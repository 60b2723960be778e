import pytest
import torch
from torch import nn

from vlhub.modeling.inference_dtype import quantize_linear_weights, read_cpu_flags


def test_read_cpu_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert read_cpu_flags(cpuinfo) == frozenset({"fpu", "avx2", "amx_bf16"})
    assert read_cpu_flags(tmp_path / "absent") == frozenset()


def test_int8_keeps_outputs_close_and_refuses_training():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
    with pytest.raises(ValueError, match="inference only"):
        quantize_linear_weights(model)
    model.eval()
    inputs = torch.randn(4, 32)
    expected = model(inputs)
    quantized = quantize_linear_weights(model)
    torch.testing.assert_close(quantized(inputs), expected, atol=0.05, rtol=0.05)
    with pytest.raises(ValueError, match="only 'int8'"):
        quantize_linear_weights(model, "int4")
