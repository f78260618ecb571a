"""`python -m trainer`: the run's orchestrator. Not built yet (issue 5); says so instead of pretending."""

import sys

if __name__ == "__main__":
    print(
        "proofstream: the trainer (`python -m trainer --algo es|grpo`) is not built yet; "
        "the wire and `python -m ops` are. See README.md, 'Status'.",
        file=sys.stderr,
    )
    sys.exit(2)
