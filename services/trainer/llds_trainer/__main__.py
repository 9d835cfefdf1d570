"""``python -m llds_trainer`` = ``llds trainer run``."""

import sys

from llds_trainer.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(sys.argv[1:]))
