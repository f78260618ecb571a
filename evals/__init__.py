"""Evaluations on top of the roles: pass@k of a policy version, comparisons of algorithms, sweeps over their
settings (docs/brief/DESIGN.md, "Layers": evals/ uses the roles' public functions, and no role imports it)."""
