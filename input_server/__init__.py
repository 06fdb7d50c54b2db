"""input-server: a gRPC server that runs Grain tokenize-pack-batch pipelines for JAX trainers."""

__version__ = "0.1.0"
