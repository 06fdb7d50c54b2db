"""Generated stubs; see scripts/tools/gen_protos.py."""
