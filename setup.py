from pathlib import Path

from setuptools import find_namespace_packages, setup

setup(
    name="vlhub",
    version="0.1.0.dev0",
    description=(
        "UNITER, VL-BERT, ViLBERT, Unified VLP and TDEN as Hugging Face transformers models, "
        "with processors, pipelines, conversion of the original releases and accelerate training."
    ),
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_namespace_packages(include=["vlhub", "vlhub.*"]),
    include_package_data=True,
    # evaluation/<metric>/<metric>.py are `evaluate` modules (folders, not packages): shipped as data.
    package_data={"vlhub": ["**/*.json", "**/*.txt", "**/*.md", "evaluation/*/*.py"]},
    install_requires=[
        "torch>=2.4",
        "torchvision>=0.19",
        "transformers>=5.17,<5.25",  # tested on 5.17, 5.23 and 5.24 (5.24 renamed the cache: vlhub/utils/compat.py)
        "accelerate>=1.10",
        "datasets>=4.0",
        "tokenizers>=0.21",
        "safetensors>=0.4",
        "evaluate>=0.4.6",
        "huggingface-hub>=1.0",
        "numpy",
        "pillow",
        "pyarrow",  # the region store's Arrow shards (also a datasets dependency)
        "xxhash",  # the region store's row checksums (also a datasets dependency)
        "pyyaml",  # the detector ports' config.yaml
        "tqdm",
        "filelock",  # one process at a time writes the shapes world's cache (also a huggingface-hub dependency)
        "torchdata>=0.8",  # StatefulDataLoader: --streaming resumes each process's stream exactly
    ],
    extras_require={
        # readers of the original projects' feature files (LMDB: UNITER, ViLBERT; HDF5: Unified VLP)
        "stores": ["lmdb>=1.4", "h5py>=3.8", "msgpack>=1.0"],
        # the COCO caption metrics (BLEU, METEOR, ROUGE-L, CIDEr-D; METEOR and the PTB tokenizer need Java)
        "captions": ["pycocoevalcap>=1.2"],
        # the browser app (`vlhub app`); gradio_client comes with gradio
        "app": ["gradio>=6,<7"],
        # gradio and selenium for the app's tests (the browser test drives Debian's chromium + chromium-driver);
        # pytest-xdist spreads the suite over the cores (scripts/test.sh); ruff is CI's linter and formatter, pinned
        # to a minor release because its formatting style may change between them
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.5",
            "parameterized>=0.9",  # imported by transformers' test_modeling_common.py (tests/models/)
            "lmdb>=1.4",
            "h5py>=3.8",
            "msgpack>=1.0",
            "pycocoevalcap>=1.2",
            "gradio>=6,<7",
            "selenium>=4.20",
            "ruff>=0.17.6,<0.18",
        ],
        # the documentation site (mkdocs.yml, docs/): `mkdocs serve`; CI runs `mkdocs build --strict`
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5"],
        # a contributor's checkout: the above plus the git hooks of .pre-commit-config.yaml (`pre-commit install`)
        "dev": ["vlhub[test,docs]", "pre-commit>=3.5"],
    },
    entry_points={"console_scripts": ["vlhub=vlhub.cli:main"]},
)
