"""The version of indeed (also in pyproject.toml): the bottom layer, importable by every other."""

__version__ = "0.2.0"
