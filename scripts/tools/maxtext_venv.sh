#!/usr/bin/env bash
# Builds (or reuses) a Python 3.12 venv with real MaxText for the MaxText tests and benchmark:
# `pip install maxtext==VERSION`, then the CPU lines of the decoupled-requirements.txt that its
# wheel ships (no nvidia-*, cuda-* or apache-tvm-ffi), then this repository's client.
# maxtext_constraints.txt pins every package as first built and tested, so a rebuilt venv is
# the same one. The venv is kept between runs and rebuilt only when this script, the
# constraints or the pin change.
# Says what it is doing on stderr (lines starting "maxtext_venv:"); prints the venv's python
# on its last line. `--check` builds nothing: it prints the venv's folder and exits 0 when that
# venv is built and current, 1 when a run would build it (the test suite says so first).
set -euo pipefail
MAXTEXT_VERSION="${MAXTEXT_VERSION:-0.2.5}"
here="$(cd "$(dirname "$0")/../.." && pwd)"  # the repository: this is scripts/tools/
venv="${INPUT_SERVER_MAXTEXT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/input-server/maxtext-$MAXTEXT_VERSION-py3.12}"
constraints="$here/scripts/tools/maxtext_constraints.txt"
stamp="$(cat "$0" "$constraints" | sha256sum | cut -c1-16)-$MAXTEXT_VERSION"

say() { echo "maxtext_venv: $*" >&2; }

find_python312() {
  # pyenv's shims answer `command -v` even when that version is not selected, so each
  # candidate is run once to see that it works.
  for candidate in "$HOME"/.pyenv/versions/3.12*/bin/python3.12 python3.12; do
    if "$candidate" -c "" >/dev/null 2>&1; then command -v "$candidate"; return; fi
  done
  echo "maxtext_venv: no Python 3.12 found (MaxText $MAXTEXT_VERSION needs it)" >&2
  exit 2
}

current() { [[ -f "$venv/.stamp" && "$(cat "$venv/.stamp")" == "$stamp" ]]; }
if [[ "${1:-}" == "--check" ]]; then
  echo "$venv"
  current
  exit
fi

# One run at a time builds, checks or reinstalls (test workers and checkouts share the venv):
# the lock is beside the venv, which a rebuild removes.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if ! current; then
  say "building MaxText $MAXTEXT_VERSION's venv at $venv (~2 GB, a few minutes, once;" \
    "INPUT_SERVER_MAXTEXT_VENV=DIR puts it elsewhere)"
  if [[ -e "$venv" ]]; then say "(replacing the one there: another version of this script built it)"; fi
  rm -rf "$venv"
  python312="$(find_python312)"
  say "1/4 a Python 3.12 venv from $python312"
  "$python312" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  say "2/4 pip install maxtext==$MAXTEXT_VERSION (versions pinned by scripts/tools/maxtext_constraints.txt)"
  "$venv/bin/python" -m pip install -q -c "$constraints" "maxtext==$MAXTEXT_VERSION" >&2
  reqs="$("$venv/bin/python" - <<'PY'
import importlib.metadata as md
files = [f for f in md.files("maxtext") if f.name == "decoupled-requirements.txt"]
print(files[0].locate() if files else "")
PY
)"
  if [[ -z "$reqs" ]]; then
    echo "maxtext_venv: maxtext $MAXTEXT_VERSION ships no decoupled-requirements.txt" >&2
    exit 2
  fi
  grep -v -E '^\s*(#|$)|^(nvidia-|cuda-|apache-tvm-ffi)' "$reqs" > "$venv/cpu-requirements.txt"
  say "3/4 MaxText's CPU requirements ($(wc -l < "$venv/cpu-requirements.txt") packages: jax, grain, ...)"
  "$venv/bin/python" -m pip install -q -c "$constraints" -r "$venv/cpu-requirements.txt" >&2
  echo "$stamp" > "$venv/.stamp"
  say "4/4 this checkout's client; the venv holds $(du -sh "$venv" | cut -f1)"
fi
# The client is reinstalled when this checkout's differs from the one installed (the tests
# exercise this checkout's code), under the lock, and only then: a reinstall removes the
# package's files first, and a MaxText run of another test worker importing it meanwhile
# failed. (A run of another checkout with another client can still meet a reinstall.)
# It is built from a copy, so no build/ folder left in the tree brings back deleted files.
client_stamp="$(cd "$here/client" && find . -type f -not -path '*/build/*' -not -path '*.egg-info/*' \
  -not -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)"
if [[ ! -f "$venv/.client-stamp" || "$(cat "$venv/.client-stamp")" != "$client_stamp" ]]; then
  copy="$(mktemp -d)"
  trap 'rm -rf "$copy"' EXIT
  cp -r "$here/client" "$copy/client"
  rm -rf "$copy/client/build" "$copy"/client/*.egg-info
  "$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$copy/client" >&2
  echo "$client_stamp" > "$venv/.client-stamp"
fi
flock -u 9
echo "$venv/bin/python"
