"""The server's version: a module of its own on the ground floor, so that the modules that
stamp it (the remembered tuning, the tokenizer cache, the token cache's key, `GetInfo`, the
metrics) need not import the package's face, which sits above them."""

__version__ = "0.1.0"
