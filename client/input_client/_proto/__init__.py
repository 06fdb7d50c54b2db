"""Generated stubs; see scripts/gen_protos.py."""
