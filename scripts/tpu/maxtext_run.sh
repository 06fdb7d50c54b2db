#!/usr/bin/env bash
# Real MaxText 0.2.5 on a TPU v5e device machine (one chip), fed by (a) its own Grain pipeline
# (grain_worker_count=1), (c) the sidecar (`input-server serve` on a Unix socket, MaxText through
# `python -m input_client.maxtext.train --server`), then, while time is left, (b) Grain with
# grain_worker_count=-1 and (a), (c), (b) with the Llama 3 tokenizer, and (3) (c) SIGKILLed and
# restarted from its checkpoint (`MX_ONLY="c_server_llama2 r_server_llama2"`: those alone). One
# run each; MaxText's logs,
# each run's numbers and a JSON summary (also $OUT/summary.json) go to $OUT.
#
# There (project root, $OUT set, carry [".whl-tpu", ".whl-mx", ".tpu-kit"]; ≤ 540 s):
#     bash scripts/tpu/maxtext_run.sh
# Here, to check the command lines (MaxText's CPU venv, a tiny model, 5 steps a run):
#     MX_LOCAL=1 OUT=/tmp/mx-local bash scripts/tpu/maxtext_run.sh
#
# Needs .whl-tpu (../shared/tpu/wheels.sh), .whl-mx (scripts/tpu/maxtext_wheels.sh) and
# .tpu-kit/{corpus.jsonl,tokenizer.llama2,tokenizer_llama3.tiktoken}.
set -uo pipefail
: "${OUT:?set OUT to the folder for the logs}"
mkdir -p "$OUT"
BUDGET_S="${MX_BUDGET_S:-540}"
START=$SECONDS
left() { echo $((BUDGET_S - (SECONDS - START))); }
say() { echo "maxtext_run[$((SECONDS - START))s]: $*"; }
ROOT="$PWD"
KIT="$ROOT/.tpu-kit"
W=/tmp/mxrun                      # helper scripts, the Parquet corpus, MaxText's output
SITE="${MX_SITE:-/tmp/site}"      # .whl-tpu installed
MX="${MX_DIR:-/tmp/mx}"           # the index's packages, .whl-mx's and MaxText
SOCK=/tmp/is.sock
rm -rf "$W" && mkdir -p "$W/data1" "$W/data8" "$W/out"
export DECOUPLE_GCLOUD=TRUE       # MaxText's stubs for GCS, diagnostics, goodput (no network)

if [[ -n "${MX_LOCAL:-}" ]]; then # this CPU host: MaxText's venv; the server in this Python
  PY="$(bash scripts/tools/maxtext_venv.sh | tail -1)"
  SERVER_PY=python3
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ROOT:$ROOT/client"
  export JAX_PLATFORMS=cpu MX_STEADY_FROM=1
  unset XLA_FLAGS
  STEPS=5                         # step 0 is the compile
  MODEL=(vocab_size=32000 base_emb_dim=64 base_num_decoder_layers=2 base_num_query_heads=4
    base_num_kv_heads=4 head_dim=16 base_mlp_dim=256 hardware=cpu attention=dot_product
    per_device_batch_size=2 max_target_length=128)
  LLAMA3_TILING=2
  RUN_TIMEOUT=300
  RESTART_PERIOD=2 RESTART_KILL=2
else
  PY=python3
  SERVER_PY=python3
  STEPS=61                        # step 0 compiles; 60 after
  # A Llama-2-like decoder: 8 layers of width 1024 (8 heads of 128, SwiGLU 2816), ~135 M
  # parameters with the 32k vocabulary; 8 × 2048 tokens a step. (MaxText's base.yml otherwise:
  # decoder_block llama2, bf16 activations, float32 weights, full remat, scanned layers.)
  MODEL=(base_emb_dim=1024 base_num_decoder_layers=8 base_num_query_heads=8 base_num_kv_heads=8
    head_dim=128 base_mlp_dim=2816 per_device_batch_size=8 max_target_length=2048)
  LLAMA3_TILING=4                 # 16k tokens × 128,256 float32 logits = 8.4 GB untiled
  RUN_TIMEOUT=170
  RESTART_PERIOD=20 RESTART_KILL=25

  say "1/3 install: .whl-tpu -> $SITE; the index's and .whl-mx's -> $MX"
  rm -rf "$MX" "$MX-auto"
  PIP=(env PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-deps --no-compile
    --no-cache-dir --disable-pip-version-check)
  "${PIP[@]}" --no-index --upgrade --target "$SITE" .whl-tpu/*.whl 2>&1 | tail -5
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE:$MX:$ROOT:$ROOT/client"
fi
export PYTHONPATH

# ---- helpers (written once; the local check runs the same ones) --------------------------
cat > "$W/resolve.py" <<'PY'
"""Each `name==pin` of a requirements file, as the version the machine's index has nearest to
the pin (the pin, else the newest below it, else the oldest above) whose wheel installs here
and whose METADATA accepts this Python and this machine's jax/jaxlib/numpy/ml_dtypes/scipy.
Prints the resolved lines; notes on stderr."""
import html, platform, re, sys, urllib.parse, zipfile
from email.parser import Parser
from importlib import metadata as md

try:
    from packaging import tags
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import Version
except ImportError:
    from pip._vendor.packaging import tags
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
    from pip._vendor.packaging.version import Version

INDEX = sys.argv[2] if len(sys.argv) > 2 else "/opt/pypi/simple"
CORE = {"jax", "jaxlib", "numpy", "ml-dtypes", "scipy", "opt-einsum", "libtpu"}
PYV = platform.python_version()
SUPPORTED = set(tags.sys_tags())


def installed(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def files(name):
    page = f"{INDEX}/{name}/index.html"
    try:
        text = open(page, encoding="utf-8").read()
    except OSError:
        return {}
    out = {}
    for attrs, label in re.findall(r"<a\s([^>]*)>([^<]*)</a>", text):
        href = re.search(r'href="([^"]*)"', attrs)
        if not href or not label.strip().endswith(".whl"):
            continue
        try:
            _, version, _, wtags = parse_wheel_filename(label.strip())
        except Exception:
            continue
        if not wtags & SUPPORTED:
            continue
        url = urllib.parse.urljoin("file://" + page, html.unescape(href.group(1))).split("#")[0]
        rp = re.search(r'data-requires-python="([^"]*)"', attrs)
        out.setdefault(version, (url, html.unescape(rp.group(1)) if rp else ""))
    return out


def problems(url, requires_python):
    """Why this wheel does not suit this machine ([] if it does)."""
    from packaging.specifiers import SpecifierSet

    why = []
    if requires_python and not SpecifierSet(requires_python).contains(PYV, prereleases=True):
        why.append(f"Requires-Python {requires_python}")
    if not url.startswith("file://"):
        return why
    try:
        with zipfile.ZipFile(urllib.parse.unquote(url[len("file://"):])) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            msg = Parser().parsestr(z.read(meta).decode("utf-8", "replace"))
    except Exception as e:
        return why + [f"unreadable ({e})"]
    rp = msg.get("Requires-Python")
    if rp and not SpecifierSet(rp).contains(PYV, prereleases=True):
        why.append(f"Requires-Python {rp}")
    for line in msg.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
        except Exception:
            continue
        name = canonicalize_name(req.name)
        have = installed(name)
        if name in CORE and have and not req.specifier.contains(have, prereleases=True):
            why.append(f"{req} (here {name} {have})")
    return why


for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, _, pin = line.partition("==")
    name = canonicalize_name(name)
    found = files(name)
    if not found:
        print(f"resolve: {name}: not on the index", file=sys.stderr)
        continue
    want = Version(pin) if pin else max(found)
    order = sorted((v for v in found if v == want), reverse=True)
    order += sorted((v for v in found if v < want), reverse=True)
    order += sorted(v for v in found if v > want)
    chosen = None
    for v in order:
        why = problems(*found[v])
        if not why:
            chosen = v
            break
        print(f"resolve: {name} {v} skipped: {'; '.join(why)}", file=sys.stderr)
    if chosen is None:
        chosen = order[0]
        print(f"resolve: {name}: no version fits; taking {chosen}", file=sys.stderr)
    note = "" if str(chosen) == pin else f" (pinned {pin}; index has {[str(v) for v in sorted(found)]})"
    print(f"resolve: {name}=={chosen}{note}", file=sys.stderr)
    print(f"{name}=={chosen}")
PY

runner_options() { # SERVER_ADDRESS_OR_EMPTY: scripts/bench/maxtext_runner.py's JSON options
  [[ -z "$1" ]] && { echo '{}'; return; }
  echo "{\"server\": \"$1\"${MX_BADPUT:+, \"badput\": \"$MX_BADPUT\"}}"
}
RUNNER="$ROOT/scripts/bench/maxtext_runner.py"

cat > "$W/cpu.py" <<'PY'
"""Samples the CPU seconds of process trees every 0.5 s: argv OUTFILE NAME=PID ...; one JSON
line {t, NAME: seconds} a sample, until every root is gone or OUTFILE.stop exists. Reads
/proc/PID/stat per process (gVisor's /proc/stat reads zeros); a process that exits keeps its
last reading."""
import json, os, sys, time

HZ = os.sysconf("SC_CLK_TCK")
out, roots = sys.argv[1], {k: int(v) for k, v in (a.split("=") for a in sys.argv[2:])}
last = {}  # pid -> (start time, cpu seconds)


def snapshot():
    parent, cpu = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(d)
        parent[pid] = int(rest[1])
        cpu[pid] = (rest[19], (int(rest[11]) + int(rest[12])) / HZ)
    return parent, cpu


with open(out, "w") as f:
    while not os.path.exists(out + ".stop"):
        parent, cpu = snapshot()
        row = {"t": time.time()}
        alive = False
        for name, root in roots.items():
            tree, stack = set(), [root]
            while stack:
                p = stack.pop()
                if p in cpu and p not in tree:
                    tree.add(p)
                    stack += [c for c, pp in parent.items() if pp == p]
            alive |= root in cpu
            for p in tree:
                last[(name, p, cpu[p][0])] = cpu[p][1]
            row[name] = sum(v for (n, _, _), v in last.items() if n == name)
        f.write(json.dumps(row) + "\n")
        f.flush()
        if not alive:
            break
        time.sleep(0.5)
PY

cat > "$W/summary.py" <<'PY'
"""One run's numbers from MaxText's log, the runner's BENCH line and the CPU samples.
argv: NAME LOG CPUFILE [SERVERCPUFILE]. Prints the run's JSON object."""
import datetime, json, os, re, statistics, sys

name, log_path, cpu_path = sys.argv[1:4]
server_cpu_path = sys.argv[4] if len(sys.argv) > 4 else ""
log = open(log_path, errors="replace").read()
STEP = re.compile(
    r"^I(\d{4}) (\d\d:\d\d:\d\d\.\d+).*completed step: (\d+), seconds: ([\d.]+), "
    r"TFLOP/s/device: ([\d.]+), Tokens/s/device: ([\d.]+), total_weights: (\d+), loss: ([\d.]+)",
    re.M)
year = datetime.date.today().year
steps = {}
for md_, hms, s, sec, tf, tok, w, loss in STEP.findall(log):
    t = datetime.datetime.strptime(f"{year}{md_} {hms}", "%Y%m%d %H:%M:%S.%f").timestamp()
    steps[int(s)] = dict(t=t, s=float(sec), tflops=float(tf), tokens=float(tok), w=int(w),
                         loss=float(loss))
waits_logged = {int(s): float(w) for w, s in re.findall(r"data_wait: ([\d.]+) s, step: (\d+)", log)}
bench = re.search(r"^BENCH (.*)$", log, re.M)
bench = json.loads(bench.group(1)) if bench else {}
FROM = int(os.environ.get("MX_STEADY_FROM", 5))  # steady from step 5 (step 0 compiles)
steady = [steps[s] for s in sorted(steps) if s >= FROM]
res = {"feed": name, "steps_logged": len(steps), "ok": bool(steps) and max(steps) + 1 >= 2}
med = lambda xs: round(statistics.median(xs), 4) if xs else None
if steady:
    res.update(median_step_s=med([x["s"] for x in steady]),
               tokens_per_s_per_device=med([x["tokens"] for x in steady]),
               tflops_per_s_per_device=med([x["tflops"] for x in steady]))
res["losses_first_10"] = [steps[s]["loss"] for s in sorted(steps)[:10]]
try:  # MaxText's metrics_file: the losses unrounded
    rows = [json.loads(l) for l in open(log_path.replace(".log", ".metrics.jsonl")) if l.strip()]
    full = {r["step"]: r["learning/loss"] for r in rows if "learning/loss" in r}
    res["losses_first_10_full"] = [full[s] for s in sorted(full)[:10]]
except (OSError, ValueError, KeyError):
    pass
res["total_weights_first_10"] = [steps[s]["w"] for s in sorted(steps)[:10]]
waits = bench.get("waits", [])
if waits:
    res["first_wait_s"] = round(waits[0][1], 4)
    res["first_batch_since_start_s"] = round(waits[0][0] + waits[0][1], 2)
    res["data_wait_median_s"] = med([w for _, w in waits[FROM:]])
    res["data_wait_max_after_first_s"] = round(max([w for _, w in waits[1:]] or [0]), 4)
if waits_logged:
    res["data_wait_logged_median_s"] = med([w for s, w in waits_logged.items() if s >= FROM])
    res["data_wait_logged_step0_s"] = waits_logged.get(0)
res["wall_s"] = round(bench.get("wall_s", 0), 1)


def cores(path, key):
    """CPU seconds / wall seconds of a tree between the completion of step FROM and the last."""
    if not path or len(steady) < 2:
        return None
    rows = [json.loads(l) for l in open(path) if l.strip()]
    t0, t1 = steady[0]["t"], steady[-1]["t"]
    def at(t):
        before = [r for r in rows if r["t"] <= t and key in r]
        return before[-1] if before else None
    a, b = at(t0), at(t1)
    if not a or not b or b["t"] <= a["t"]:
        return None
    return round((b[key] - a[key]) / (b["t"] - a["t"]), 3)

res["host_cores_trainer"] = cores(cpu_path, "trainer")
if server_cpu_path:
    res["host_cores_server"] = cores(server_cpu_path, "server")
print(json.dumps(res))
PY

# ---- install (TPU) ---------------------------------------------------------------------------
if [[ -z "${MX_LOCAL:-}" ]]; then
  python3 "$W/resolve.py" .whl-mx/from_index.txt > "$OUT/from_index.resolved.txt" 2> "$OUT/resolve.log"
  cat "$OUT/resolve.log"
  # One pip call for all: a second --target install into /tmp/mx would skip (or, with
  # --upgrade, replace) the folders the first made, such as the shared `google/`.
  "${PIP[@]}" --ignore-requires-python --index-url file:///opt/pypi/simple --target "$MX" \
    -r "$OUT/from_index.resolved.txt" .whl-mx/*.whl > "$OUT/pip.log" 2>&1 \
    || { say "pip failed:"; tail -20 "$OUT/pip.log"; }
  say "installed: $(ls "$MX" | grep -c dist-info) distributions in $MX"
  # MaxText 0.2.5 against this machine's older JAX (0.10.2): what does not import, patched in
  # the installed copy (each patch printed; nothing else of MaxText changes).
  python3 - "$MX" <<'PATCH' | tee "$OUT/patches.txt"
import sys
MX = sys.argv[1]
PATCHES = [
    # jax.experimental.xla_metadata.must_fuse_call is newer than JAX 0.10.2; only MaxText's
    # pure-JAX flash kernel (not the TPU path: splash attention) calls it, as a fusion hint.
    ("maxtext/kernels/attention/jax_flash_attention.py",
     "from jax.experimental.xla_metadata import must_fuse_call\n",
     "try:\n  from jax.experimental.xla_metadata import must_fuse_call\n"
     "except ImportError:  # JAX < must_fuse_call: no fusion hint\n"
     "  must_fuse_call = lambda name: (lambda f: f)\n"),
    # The index's transformers (5.17) refuses at import the huggingface-hub 2.4 that .whl-tpu
    # carries ("huggingface-hub>=1.5.0,<2.0 is required"); MaxText's pre-training imports it
    # only for its tokenizer module (huggingface tokenizers, unused here). 5.24 accepts <3.0.
    # PEP 695 `type X = ...` (Python 3.12) in the mHC kernel, which maxtext.layers.mhc imports
    # on the pre-training path: a plain alias under 3.11.
    ("maxtext/kernels/mhc/api.py",
     'type Implementation = Literal["mosaic", "mosaic_tpu", "xla"]',
     'Implementation = Literal["mosaic", "mosaic_tpu", "xla"]'),
    ("maxtext/kernels/mhc/common.py",
     "type KernelContext = tuple[jax.Array, jax.Array, jax.Array]",
     "KernelContext = tuple[jax.Array, jax.Array, jax.Array]"),
    ("transformers/dependency_versions_table.py",
     '"huggingface-hub": "huggingface-hub>=1.5.0,<2.0"',
     '"huggingface-hub": "huggingface-hub>=1.5.0,<3.0"'),
]
for path, old, new in PATCHES:
    full = f"{MX}/{path}"
    text = open(full).read()
    if old in text:
        open(full, "w").write(text.replace(old, new, 1))
        print(f"patched {path}: {old.strip()}")
    else:
        print(f"not patched (text not found) {path}: {old.strip()}")
PATCH
fi

# ---- import check --------------------------------------------------------------------------
say "2/3 import maxtext.trainers.pre_train.train"
IMPORTS="import maxtext.trainers.pre_train.train, input_client.maxtext.train, pyarrow, tiktoken, sentencepiece"
for attempt in 1 2 3 4 5 6; do
  if JAX_PLATFORMS=cpu "$PY" -c "$IMPORTS" > "$OUT/import.log" 2>&1; then
    say "import maxtext.trainers.pre_train.train: OK"; break
  fi
  missing="$(grep -oP "No module named '\K[^'.]+" "$OUT/import.log" | tail -1)"
  if [[ -z "${MX_LOCAL:-}" && -n "$missing" && $attempt -lt 6 ]]; then
    # A module the CPU venv's run did not load: take its namesake from the index, and say so.
    say "import failed: no module $missing; trying the index's ${missing//_/-}"
    echo "${missing//_/-}" >> "$OUT/auto_installed.txt"
    "${PIP[@]}" --ignore-requires-python --index-url file:///opt/pypi/simple --target "$MX-auto" \
      "${missing//_/-}" >> "$OUT/pip.log" 2>&1 || true
    [[ ":$PYTHONPATH:" == *":$MX-auto:"* ]] || export PYTHONPATH="$PYTHONPATH:$MX-auto"
    continue
  fi
  say "import FAILED (written to $OUT/import_failed.txt):"
  tail -25 "$OUT/import.log" | tee "$OUT/import_failed.txt"
  exit 1
done

[[ -n "${MX_STOP_AFTER_IMPORT:-}" ]] && { say "stopping after the import (MX_STOP_AFTER_IMPORT)"; exit 0; }

# ---- data ----------------------------------------------------------------------------------
# MaxText reads Parquet, not JSON lines. One file for (a) and (c): MaxText interleaves the
# documents of several files, so one file gives both feeds the same documents in the same order;
# eight for (b), whose worker processes each read their own files.
"$PY" - "$KIT/corpus.jsonl" "$W" <<'PY'
import json, os, sys
import pyarrow as pa, pyarrow.parquet as pq
texts = [json.loads(l)["text"] for l in open(sys.argv[1])]
pq.write_table(pa.table({"text": texts}), os.path.join(sys.argv[2], "data1", "part-0.parquet"))
for i in range(8):
    pq.write_table(pa.table({"text": texts[i::8]}), os.path.join(sys.argv[2], "data8", f"part-{i}.parquet"))
print(f"corpus: {len(texts)} documents, {sum(map(len, texts))} characters -> Parquet (1 and 8 files)")
PY

# MaxText's own keys, the same for every feed. Unshuffled, so (a) and (c) see the same batches
# and their losses compare; num_epoch 5: the corpus is ~0.55 M tokens, a run takes 1 M.
COMMON=(skip_jax_distributed_system=true enable_checkpointing=false eval_interval=-1
  log_config=false enable_tensorboard=false dataset_type=grain grain_file_type=parquet
  enable_data_shuffling=false num_epoch=5
  "steps=$STEPS" "base_output_directory=$W/out")
ONE="grain_train_files=$W/data1/part-*.parquet"
EIGHT="grain_train_files=$W/data8/part-*.parquet"
LLAMA2=("tokenizer_path=$KIT/tokenizer.llama2" tokenizer_type=sentencepiece vocab_size=32000)
LLAMA3=("tokenizer_path=$KIT/tokenizer_llama3.tiktoken" tokenizer_type=tiktoken vocab_size=128256
  "num_vocab_tiling=$LLAMA3_TILING")

SUMMARY="$W/summary.jsonl"
: > "$SUMMARY"
SERVER_PID=""
run() { # NAME SERVER_ADDRESS_OR_EMPTY ESTIMATE_S MAXTEXT_ARGS...
  local name="$1" server="$2" need="$3"; shift 3
  local budget=$(( $(left) - 15 ))
  if [[ -n "${MX_ONLY:-}" && " $MX_ONLY " != *" $name "* ]]; then return; fi
  if (( budget < need )); then say "skip $name: $(left) s left, it needs ~$need"; return; fi
  (( budget > RUN_TIMEOUT )) && budget=$RUN_TIMEOUT
  say "run $name (timeout ${budget}s)"
  rm -f "$W/cpu-$name.jsonl.stop"
  timeout -k 5 "$budget" "$PY" "$RUNNER" "$(runner_options "$server")" run_name="$name" "${MODEL[@]}" "${COMMON[@]}" \
    "metrics_file=$OUT/$name.metrics.jsonl" "$@" \
    > "$OUT/$name.log" 2>&1 &
  local pid=$!
  python3 "$W/cpu.py" "$W/cpu-$name.jsonl" trainer=$pid &
  local sampler=$!
  local server_sampler=""
  if [[ -n "$SERVER_PID" ]]; then
    python3 "$W/cpu.py" "$W/srv-$name.jsonl" server=$SERVER_PID &
    server_sampler=$!
  fi
  wait $pid; local rc=$?
  touch "$W/cpu-$name.jsonl.stop" "$W/srv-$name.jsonl.stop"
  wait $sampler; [[ -n "$server_sampler" ]] && wait "$server_sampler"
  cp "$W/cpu-$name.jsonl" "$OUT/" 2>/dev/null; [[ -n "$server_sampler" ]] && cp "$W/srv-$name.jsonl" "$OUT/"
  say "$name exit $rc; its step lines:"
  grep -E "completed step:|data_wait:" "$OUT/$name.log" | sed -E 's/^.*(completed step|data_wait)/\1/'
  if ! grep -q "completed step:" "$OUT/$name.log"; then
    say "$name logged no step; its log's end:"; tail -30 "$OUT/$name.log"
  fi
  python3 "$W/summary.py" "$name" "$OUT/$name.log" "$W/cpu-$name.jsonl" \
    ${server_sampler:+"$W/srv-$name.jsonl"} | sed "s/^{/{\"exit\": $rc, /" | tee -a "$SUMMARY"
}

start_server() {
  say "start the sidecar (JAX_PLATFORMS=cpu, workers auto) at unix://$SOCK"
  rm -f "$SOCK"
  JAX_PLATFORMS=cpu "$SERVER_PY" -m input_server.cli serve --listen "unix://$SOCK" \
    --data-root "$W/data1" --data-root "$KIT" > "$OUT/server.log" 2>&1 &
  SERVER_PID=$!
  if ! JAX_PLATFORMS=cpu "$SERVER_PY" -c "
from input_client import InputClient
with InputClient('unix://$SOCK', connect_timeout_s=60) as c:
    c.wait_ready()"; then
    say "the server did not come up:"; tail -20 "$OUT/server.log"; kill "$SERVER_PID" 2>/dev/null; SERVER_PID=""
  fi
}

run_killed() { # NAME KILL_AFTER_STEP SERVER_ADDRESS ESTIMATE_S MAXTEXT_ARGS...: a run SIGKILLed
  # once it logs step KILL_AFTER_STEP (a preempted job); its checkpoints stay in $W/out/NAME.
  local name="$1" kill_at="$2" server="$3" need="$4"; shift 4
  if [[ -n "${MX_ONLY:-}" && " $MX_ONLY " != *" $name "* ]]; then return 1; fi
  if (( $(left) - 15 < need )); then say "skip $name: $(left) s left, it needs ~$need"; return 1; fi
  say "run $name, SIGKILLed after step $kill_at"
  # Without job control a background `setsid` is no group leader, so it does not fork: $! is
  # the new process group's id, which `kill -9 -- -PID` ends with its children.
  setsid "$PY" "$RUNNER" "$(runner_options "$server")" run_name="$name" "${MODEL[@]}" "${COMMON[@]}" "$@" \
    > "$OUT/$name.killed.log" 2>&1 &
  local pid=$! waited=0
  until grep -q "completed step: $kill_at," "$OUT/$name.killed.log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null || (( waited >= 5 * RUN_TIMEOUT )); then
      say "$name ended or timed out before step $kill_at:"; tail -20 "$OUT/$name.killed.log"
      kill -9 -- -"$pid" 2>/dev/null; return 1
    fi
    sleep 0.2; waited=$((waited + 1))
  done
  kill -9 -- -"$pid"; wait "$pid" 2>/dev/null
  say "$name killed; checkpoints: $(ls "$W/out/$name/checkpoints" 2>/dev/null | tr '\n' ' ')"
}

say "3/3 train ($STEPS steps a run; $(left) s left)"
run a_grain1_llama2 "" 110 "$ONE" "${LLAMA2[@]}" grain_worker_count=1
start_server
[[ -n "$SERVER_PID" ]] && run c_server_llama2 "unix://$SOCK" 100 "$ONE" "${LLAMA2[@]}"
# (3) The same job fed by the sidecar, checkpointing every RESTART_PERIOD steps, SIGKILLed after
# step RESTART_KILL and started again: it restores the last checkpoint, its data position with
# it, and goes on; its losses against c_server_llama2's uninterrupted ones in the summary.
CHECKPOINTS=(enable_checkpointing=true async_checkpointing=false
  "checkpoint_period=$RESTART_PERIOD")
export MX_BADPUT="$OUT/r_server_llama2.badput.jsonl"  # both runs' lines: the job's record
if [[ -n "$SERVER_PID" ]] && run_killed r_server_llama2 "$RESTART_KILL" "unix://$SOCK" 150 \
    "$ONE" "${LLAMA2[@]}" "${CHECKPOINTS[@]}"; then
  # The same `steps` as the uninterrupted run: the learning-rate schedule spans them.
  run r_server_llama2 "unix://$SOCK" 80 "$ONE" "${LLAMA2[@]}" "${CHECKPOINTS[@]}"
  grep -o "restoring from this run's directory step [0-9]*" "$OUT/r_server_llama2.log" \
    > "$OUT/r_server_llama2.restored.txt"
  say "$(cat "$OUT/r_server_llama2.restored.txt")"
  "$PY" -c "import json, sys; from input_client.badput import job_badput
print('badput', json.dumps(job_badput(sys.argv[1])))" "$MX_BADPUT" | tee "$OUT/r_server_llama2.job_badput.txt"
fi
unset MX_BADPUT
run b_grainauto_llama2 "" 100 "$EIGHT" "${LLAMA2[@]}" grain_worker_count=-1
run a_grain1_llama3 "" 110 "$ONE" "${LLAMA3[@]}" grain_worker_count=1
[[ -n "$SERVER_PID" ]] && run c_server_llama3 "unix://$SOCK" 100 "$ONE" "${LLAMA3[@]}"
run b_grainauto_llama3 "" 100 "$EIGHT" "${LLAMA3[@]}" grain_worker_count=-1
if [[ -n "$SERVER_PID" ]]; then kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null; fi

MX_METRICS_DIR="$OUT" "$PY" - "$SUMMARY" <<'PY' | tee "$OUT/summary.json"
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = {"runs": {r.pop("feed"): r for r in runs}}
for tok in ("llama2", "llama3"):  # (a) and (c): the same ids, so the same losses
    a, c = out["runs"].get(f"a_grain1_{tok}"), out["runs"].get(f"c_server_{tok}")
    if a and c:
        n = min(len(a["losses_first_10"]), len(c["losses_first_10"]))
        fa, fc = a.get("losses_first_10_full", []), c.get("losses_first_10_full", [])
        out[f"losses_a_vs_c_{tok}"] = {
            "equal_as_logged": a["losses_first_10"][:n] == c["losses_first_10"][:n],
            "max_abs_diff_logged": max((abs(x - y) for x, y in zip(a["losses_first_10"], c["losses_first_10"])), default=None),
            "max_rel_diff_metrics_file": max((abs(x - y) / abs(x) for x, y in zip(fa, fc)), default=None),
            "total_weights_equal": a["total_weights_first_10"][:n] == c["total_weights_first_10"][:n]}
import os
def full_losses(name):  # MaxText's metrics file: each step's loss unrounded
    path = os.environ.get("MX_METRICS_DIR", "") + f"/{name}.metrics.jsonl"
    try:
        rows = [json.loads(l) for l in open(path) if l.strip()]
    except OSError:
        return {}
    return {r["step"]: r["learning/loss"] for r in rows if "learning/loss" in r}
def weights(name):  # each logged step's total_weights: which batch it trained on
    import re
    try:
        log = open(os.environ.get("MX_METRICS_DIR", "") + f"/{name}.log").read()
    except OSError:
        return {}
    return {int(s): int(w) for s, w in re.findall(r"completed step: (\d+),.*?total_weights: (\d+)", log)}
whole, resumed = full_losses("c_server_llama2"), full_losses("r_server_llama2")
if resumed:  # the restarted run against the uninterrupted one, step by step
    common = sorted(set(whole) & set(resumed))
    ww, wr = weights("c_server_llama2"), weights("r_server_llama2")
    out["restart_vs_uninterrupted_llama2"] = {
        "resumed_steps": [min(resumed), max(resumed)],
        "steps_compared": len(common),
        "total_weights_equal": all(ww.get(s) == wr.get(s) for s in common),
        "max_rel_diff": max((abs(whole[s] - resumed[s]) / abs(whole[s]) for s in common), default=None)}
print(json.dumps(out, indent=1))
PY
say "done in $((SECONDS - START)) s"
