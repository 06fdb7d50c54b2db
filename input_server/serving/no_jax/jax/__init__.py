"""What `import jax` finds in a `serve` process and its worker processes: JAX is the
trainer's, and the server tokenizes and packs with numpy (`serving/warm.py`)."""

raise ImportError("JAX is kept out of input-server's `serve` processes (serving/warm.py)")
