"""Pre-train a vlhub model with accelerate.

    python pretrain.py                                   # tiny UNITER on the embedded shapes world
    accelerate launch --num_processes 2 pretrain.py --max_steps 100
    python pretrain.py --help                            # every option

The logic lives in vlhub.training (see vlhub/training/cli.py).
"""

import sys

from vlhub.training.cli import pretrain_main
from vlhub.utils.errors import run_command

if __name__ == "__main__":
    # A bad input is one line (VLHUB_DEBUG=1 shows its traceback); a bug keeps its traceback.
    sys.exit(run_command("pretrain.py", pretrain_main))
