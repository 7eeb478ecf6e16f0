"""rank_cases.py with gloo's reduce_scatter emulated on every op, as on a torch whose gloo lacks it or gets
MIN/MAX/PRODUCT wrong (comm.collectives._gloo_reduce_scatter_unsound): the emulation meets the same
reference on the torch CI runs."""

import runpy
import sys
from pathlib import Path

from npudist.comm import collectives

collectives._gloo_reduce_scatter_unsound = lambda backend, op: backend == "gloo"
sys.argv[0] = str(Path(__file__).with_name("rank_cases.py"))
runpy.run_path(sys.argv[0], run_name="__main__")
