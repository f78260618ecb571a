"""arq entry point: `arq workers.verifier` (the verifier pool lands with issue 3)."""
