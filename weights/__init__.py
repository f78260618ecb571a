"""What the trainer and the generators must agree on about weights, below both roles.

- `weights.model`: which model a name means (resolution, conversion of the default GGUF, the folder digest);
- `weights.step`: the ES update as data (`ESStep`) and the digest of a history of steps (no torch);
- `weights.io`: safetensors in and out (fp32 masters, atomic writes) and the digest of tensors in memory;
- `weights.es`: ES noise, exact perturb/restore and deterministic replay of the fp32 master (torch).
"""
