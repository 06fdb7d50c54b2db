"""scripts/bench/bench_unigram_peer.py without TensorFlow: our served rate and the ids checks it can
make, the peer said to be not measured (TensorFlow is no dependency of the project)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import script


def test_peer_script_without_tensorflow_reports_served_rate_and_ids(spm_model, tmp_path):
    out = tmp_path / "peer.json"
    done = subprocess.run(
        [
            sys.executable,
            script("bench/bench_unigram_peer.py"),
            *("--model", spm_model, "--max-docs", "200", "--corpora", "short"),
            *("--rounds", "1", "--seconds", "0.2", "--min-tokens", "60000", "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    result = json.loads(out.read_text())
    assert json.loads(done.stdout) == result
    assert result["model"]["type"] == "UNIGRAM"
    assert result["peer"].startswith("not measured")
    short = result["corpora"]["short"]
    assert short["documents"] == 200
    assert short["peer"].startswith("not measured")
    assert short["ids"]["peer_vs_reference"].startswith("not measured")
    # Our pipeline's rows hold exactly the reference's ids, every token of every document.
    rows = short["ids"]["served_rows_vs_reference"]
    assert rows == {"tokens": short["tokens_per_epoch"], "equal": True}
    assert short["our_backend"]["documents_differing"] == 0
    assert short["served"]["tokens_per_s"] > 0 and short["served"]["tokens"] > 0
    assert short["served"]["cores_busy"] > 0
    assert short["limit"]["tokens_per_s"] > 0
    assert short["ratios"]["served_over_limit"] > 0
    assert "served_over_peer" not in short["ratios"]
