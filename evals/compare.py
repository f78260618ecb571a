"""`python -m evals.compare`: another name of `python -m evals.es_vs_grpo` (the experiment that trains ES and
GRPO at one budget and compares them); `python -m ops compare` shows runs that exist side by side."""

import sys

from evals.es_vs_grpo import main

if __name__ == "__main__":
    print("evals.compare: this is `python -m evals.es_vs_grpo`, the ES-against-GRPO experiment", file=sys.stderr)
    raise SystemExit(main())
