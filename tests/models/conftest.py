"""The pytest marks transformers' test_modeling_common.py uses (transformers' own conftest registers them), and the
print options its tests run under."""

import pytest
import torch

TRANSFORMERS_MARKS = {
    "accelerate_tests": "tests that need accelerate's multi-device setup",
    "flash_attn_test": "tests of the flash-attention kernels (GPU)",
    "flash_attn_3_test": "tests of the flash-attention 3 kernels (GPU)",
    "flash_attn_4_test": "tests of the flash-attention 4 kernels (GPU)",
    "torch_compile_test": "tests that run torch.compile",
}


def pytest_configure(config):
    for name, description in TRANSFORMERS_MARKS.items():
        config.addinivalue_line("markers", f"{name}: {description}")


@pytest.fixture(autouse=True, scope="module")
def summarised_tensor_reprs():
    """Some of transformers' common tests format both tensors into the message of every comparison, passing or not
    (`test_bc_torch_dtype`: each parameter of every head, 8 dtypes: ~8k reprs per architecture). Summarised reprs
    (one corner value per dimension) keep that cheap; a failing comparison's message still starts with the
    parameter's name. Nothing else in the suite sets print options, so the defaults are restored after."""
    torch.set_printoptions(threshold=0, edgeitems=1)
    yield
    torch.set_printoptions(profile="default")
