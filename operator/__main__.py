"""``python -m rlsched.operator`` runs the TrainingJob operator."""

import sys

from rlsched.cli import main

sys.exit(main(["operator", "run", *sys.argv[1:]]))
