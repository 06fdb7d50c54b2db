#!/usr/bin/env bash
# Prepares ./.whl-mx (git-ignored via .git/info/exclude): what a TPU v5e device machine (Python
# 3.11, JAX 0.10.2, no network, its own index at /opt/pypi/simple) needs beyond ./.whl-tpu to run
# MaxText 0.2.5's pre-training (scripts/tpu/maxtext_run.sh installs it there).
#
# 1. Trains MaxText's tiny decoder 2 steps on Grain (Parquet) in MaxText's CPU venv
#    (scripts/tools/maxtext_venv.sh) and maps every module then loaded to its distribution;
# 2. drops what the machine has (its pip list: $DEVICE_FACTS/piplist.txt), what .whl-tpu
#    carries, jax/jaxlib (the machine's own) and maxtext;
# 3. of the rest, those on the machine's index ($DEVICE_FACTS/index.txt) go to
#    .whl-mx/from_index.txt as `name==the CPU venv's version` (the run there picks the index's
#    version nearest to it that suits Python 3.11 and the machine's jax/numpy); the others are
#    downloaded here as cp311 manylinux / pure wheels (and omegaconf, typeguard: see below);
# 4. adds MaxText's wheel without its bundled tokenizer files (10 MB; the run takes its
#    tokenizers from .tpu-kit): the carry is 64 MiB in all.
# usage (from the project root): bash scripts/tpu/maxtext_wheels.sh [MAXTEXT_WHEEL]
set -euo pipefail
# The device machine's facts as read there on 2026-12-07 (`ls /opt/pypi/simple`, `pip list`).
facts="${DEVICE_FACTS:-scripts/tpu/host}"
wheel="${1:-}"
if [[ -z "$wheel" ]]; then  # MaxText's wheel from PyPI (no deps: they are worked out below)
  mkdir -p /tmp/maxtext-wheel
  python3 -m pip download -q --no-deps --only-binary=:all: -d /tmp/maxtext-wheel maxtext==0.2.5
  wheel="$(ls /tmp/maxtext-wheel/maxtext-0.2.5-*.whl | head -1)"
fi
[[ -f "$wheel" ]] || { echo "maxtext_wheels: no MaxText wheel at $wheel" >&2; exit 2; }
[[ -f "$facts/piplist.txt" && -f "$facts/index.txt" ]] || { echo "maxtext_wheels: no piplist.txt/index.txt in $facts" >&2; exit 2; }
grep -qx '/.whl-mx/' .git/info/exclude 2>/dev/null || echo '/.whl-mx/' >> .git/info/exclude
python="$(bash scripts/tools/maxtext_venv.sh | tail -1)"
rm -rf .whl-mx && mkdir -p .whl-mx
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT

echo "maxtext_wheels: 1/4 what MaxText's training path imports (2 CPU steps on Grain, ~1 min)" >&2
"$python" - "$tmp" <<'PY'
import json, os, sys
import pyarrow as pa, pyarrow.parquet as pq
texts = [json.loads(l)["text"] for l in open(".tpu-kit/corpus.jsonl")][:400]
pq.write_table(pa.table({"text": texts}), os.path.join(sys.argv[1], "part-0.parquet"))
PY
cat > "$tmp/probe.py" <<'PY'
import atexit, json, os, sys

def dump():
    import importlib.metadata as md
    found = md.packages_distributions()
    names = {d for m in list(sys.modules) for d in found.get(m.split(".")[0], [])}
    with open(os.environ["PROBE_OUT"], "w") as f:
        json.dump({n: md.version(n) for n in sorted(names)}, f)

if __name__ == "__main__":  # Grain's workers re-import __main__
    atexit.register(dump)
    from absl import app
    from maxtext.trainers.pre_train import train
    import tiktoken  # tokenizer_type=tiktoken (the Llama 3 runs)
    try:
        app.run(train.main, argv=[train.__file__, *sys.argv[1:]])
    except SystemExit as e:
        if e.code:
            raise
PY
PROBE_OUT="$tmp/dists.json" JAX_PLATFORMS=cpu DECOUPLE_GCLOUD=TRUE "$python" "$tmp/probe.py" \
  run_name=probe "base_output_directory=$tmp/out" vocab_size=32000 base_emb_dim=64 \
  base_num_decoder_layers=2 base_num_query_heads=4 base_num_kv_heads=4 head_dim=16 base_mlp_dim=256 \
  hardware=cpu attention=dot_product log_config=false enable_tensorboard=false \
  skip_jax_distributed_system=true enable_checkpointing=false eval_interval=-1 steps=2 \
  "tokenizer_path=$PWD/.tpu-kit/tokenizer.llama2" max_target_length=128 per_device_batch_size=2 \
  dataset_type=grain grain_file_type=parquet "grain_train_files=$tmp/part-*.parquet" \
  grain_worker_count=1 > "$tmp/probe.log" 2>&1 || { tail -30 "$tmp/probe.log" >&2; exit 1; }
grep -q "completed step: 1," "$tmp/probe.log" || { tail -30 "$tmp/probe.log" >&2; exit 1; }

echo "maxtext_wheels: 2/4 less what the machine has and .whl-tpu carries" >&2
"$python" - "$tmp/dists.json" "$facts" <<'PY' > "$tmp/split.txt"
import json, os, re, sys
canon = lambda n: re.sub(r"[-_.]+", "-", n).lower()
need = {canon(k): v for k, v in json.load(open(sys.argv[1])).items()}
facts = sys.argv[2]
have = {canon(l.split()[0]) for l in open(os.path.join(facts, "piplist.txt")).read().splitlines()[2:] if l.strip()}
carried = {canon(f.split("-")[0]) for f in os.listdir(".whl-tpu") if f.endswith(".whl")}
index = {canon(l.strip()) for l in open(os.path.join(facts, "index.txt")) if l.strip()}
skip = {"jax", "jaxlib", "maxtext", "input-client", "input-server"}
# omegaconf < 2.4 (what an index may hold) wants antlr4-python3-runtime 4.9.x ("Could not
# deserialize ATN with version 3 (expected 4)" with the machine's 4.13.2), which the index lacks
# and PyPI has as an sdist only; 2.4 (the CPU venv's) works with 4.13: carry it. typeguard: the
# index has 4.x only, whose import hook fails on jaxtyping's annotations ("*B T H d":
# SyntaxError) where jaxtyping wants 2.13.3. (transformers: the index's 5.17 is taken, though
# it refuses .whl-tpu's huggingface-hub 2.4 at import, wanting <2.0; maxtext_run.sh relaxes
# that check: the CPU venv's 5.24 takes 2.4 but is 13 MB, over the carry's 64 MiB.)
carry_anyway = {"omegaconf", "typeguard"}
# Not loaded by the CPU run, but wanted there: transformers checks safetensors' version when
# imported; the index's transformers imports httpx (found missing by an import of the run's
# install on this host's Python 3.11 against the index). No pin: the index's newest.
import importlib.metadata as md
for name in ("safetensors", "httpx"):
    try:
        need.setdefault(name, md.version(name))
    except md.PackageNotFoundError:
        need.setdefault(name, "")
for name, version in sorted(need.items()):
    if name in skip or name in have or name in carried:
        continue
    on_index = name in index and name not in carry_anyway
    print("index" if on_index else "download", f"{name}=={version}" if version else name)
PY
grep '^index ' "$tmp/split.txt" | cut -d' ' -f2 > .whl-mx/from_index.txt
echo "maxtext_wheels: from the machine's index ($(wc -l < .whl-mx/from_index.txt)):" $(cat .whl-mx/from_index.txt) >&2

echo "maxtext_wheels: 3/4 download the others as cp311 wheels" >&2
plat=""; for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
  manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux2010_x86_64 \
  manylinux1_x86_64 any; do plat="$plat --platform $p"; done
missing=0
for req in $(grep '^download ' "$tmp/split.txt" | cut -d' ' -f2); do
  # The CPU venv's version first; else the newest wheel for 3.11 (that version may want 3.12).
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp $plat \
    -d .whl-mx "$req" 2>/dev/null \
  || "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp $plat \
    -d .whl-mx "${req%%==*}" \
  || { echo "maxtext_wheels: no cp311 wheel for $req" >&2; missing=1; }
done

echo "maxtext_wheels: 4/4 MaxText's wheel, without its bundled tokenizers" >&2
"$python" - "$wheel" .whl-mx <<'PY'
import os, sys, zipfile
src, out = sys.argv[1], sys.argv[2]
drop = lambda n: n.startswith("maxtext/assets/tokenizers/")
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(os.path.join(out, os.path.basename(src)), "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if drop(item.filename):
            continue
        data = zin.read(item)
        if item.filename.endswith(".dist-info/RECORD"):
            data = b"".join(l for l in data.splitlines(True) if not drop(l.split(b",")[0].decode()))
        zout.writestr(item, data)
PY
ls -la .whl-mx >&2
du -sh .whl-mx
exit $missing
