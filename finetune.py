"""Fine-tune a pre-trained vlhub model with accelerate: VQA or image-text retrieval.

    python finetune.py                                   # VQA on the shapes world from runs/uniter-shapes
    python finetune.py --task retrieval --output_dir runs/uniter-shapes-itr
    python finetune.py --help                            # every option

The logic lives in vlhub.training (see vlhub/training/cli.py).
"""

from vlhub.training.cli import finetune_main

if __name__ == "__main__":
    finetune_main()
