"""The benchmarks, `python -m ops bench NAME` (one module each, its docstring says what it measures), the
flags and the ending they share (common.py), and the stand-ins they run in place of a model, a sandbox or Lean:
the synthetic generator and verifier of the pipeline bench (pipeline_roles.py) and the synthetic Lean REPL of
the verifier bench's restart phase (synthetic_repl.py)."""
