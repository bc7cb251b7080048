"""Image and mask files: reading and writing without losing depth, alpha or orientation.

The bottom layer of the package: it imports nothing else from indeed_cli.
"""

from .images import (
    IMAGE_SUFFIXES,
    JPEG_QUALITY,
    OUTPUT_SUFFIXES,
    PNG_LEVEL,
    STDIO,
    ImageError,
    LoadedImage,
    atomic_save,
    atomic_write_via,
    check_output_format,
    image_from_pil,
    is_image_path,
    is_stdio,
    read_image,
    to_pil,
    write_image,
)
from .masks import load_mask

__all__ = [
    "IMAGE_SUFFIXES",
    "JPEG_QUALITY",
    "OUTPUT_SUFFIXES",
    "PNG_LEVEL",
    "STDIO",
    "ImageError",
    "LoadedImage",
    "atomic_save",
    "atomic_write_via",
    "check_output_format",
    "image_from_pil",
    "is_image_path",
    "is_stdio",
    "load_mask",
    "read_image",
    "to_pil",
    "write_image",
]
