"""Fine-tune a pre-trained vlhub model with accelerate: VQA or image-text retrieval.

    python finetune.py                                   # VQA on the shapes world from runs/uniter-shapes
    python finetune.py --task retrieval --output_dir runs/uniter-shapes-itr
    python finetune.py --help                            # every option

The logic lives in vlhub.training (see vlhub/training/cli.py).
"""

import sys

from vlhub.training.cli import finetune_main
from vlhub.utils.errors import run_command

if __name__ == "__main__":
    # A bad input is one line (VLHUB_DEBUG=1 shows its traceback); a bug keeps its traceback.
    sys.exit(run_command("finetune.py", finetune_main))
