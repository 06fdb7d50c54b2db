"""A trainer's side of the multi-host test, run inside a network namespace: streams a spec
fanned in from the servers and prints one JSON line per batch (its SHA-256), then one with the
stream's state; a failure is one line {"error": ..., "code": ...} and exit 1.

python tests/fanin_client.py --servers A,B --spec SPEC.json --batches N [--tls-ca F]
  [--token-file F] [--pause-after K --pause-file F]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--servers", required=True)
    p.add_argument("--spec", required=True, help="a spec as JSON (PipelineSpec.to_dict())")
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--tls-ca")
    p.add_argument("--token-file")
    p.add_argument("--connect-timeout-s", type=float, default=20)
    # After this many batches, wait until this file is gone (the test kills a server meanwhile).
    p.add_argument("--pause-after", type=int, default=-1)
    p.add_argument("--pause-file")
    args = p.parse_args()

    import numpy as np

    from input_client import InputClient, InputClientError, PipelineSpec

    with open(args.spec) as f:
        spec = PipelineSpec.from_dict(json.load(f))
    try:
        with InputClient(
            args.servers.split(","),
            tls_ca=args.tls_ca,
            token_file=args.token_file,
            connect_timeout_s=args.connect_timeout_s,
        ) as client:
            with client.batches(spec, reconnect_deadline_s=60, prefetch=1) as it:
                for k in range(args.batches):
                    if k == args.pause_after:
                        print(json.dumps({"paused": k}), flush=True)
                        while os.path.exists(args.pause_file):
                            time.sleep(0.05)
                    batch = next(it)
                    digest = hashlib.sha256()
                    for name in sorted(batch):
                        digest.update(np.ascontiguousarray(batch[name]).tobytes())
                    print(json.dumps({"batch": k, "sha256": digest.hexdigest()}), flush=True)
                print(json.dumps({"state": it.get_state(), "reconnects": it.reconnects}))
    except (InputClientError, ConnectionError, ValueError, OSError) as e:
        code = getattr(getattr(e, "code", None), "name", None)
        print(json.dumps({"error": str(e), "code": code}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
