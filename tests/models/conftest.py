"""The pytest marks transformers' test_modeling_common.py uses (transformers' own conftest registers them)."""

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
