"""Pre-train a vlhub model with accelerate.

    python pretrain.py                                   # tiny UNITER on the embedded shapes world
    accelerate launch --num_processes 2 pretrain.py --max_steps 100
    python pretrain.py --help                            # every option

The logic lives in vlhub.training (see vlhub/training/cli.py).
"""

from vlhub.training.cli import pretrain_main

if __name__ == "__main__":
    pretrain_main()
