"""vlhub's version, in a module of its own so that any part of vlhub can name it without importing the package's
registration (`vlhub/__init__.py`)."""

__version__ = "0.1.0.dev0"
