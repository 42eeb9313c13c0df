"""Data for swalab: in-memory image data sets and a GPU-resident augmenting loader.

Loaders return an :class:`ImageData` (two ``uint8`` :class:`DataSplit` tensors plus class names);
:class:`ResidentLoader` moves a split to the training device once and yields normalised, augmented
batches. :func:`load_digits` needs nothing but scikit-learn and is the offline default;
:func:`load_cifar` reads CIFAR-10/100 from torchvision's pickles or from an image folder;
:func:`load_folder` reads any image folder (``train/<class>/*``, ``test/<class>/*``).
"""

from .cache import CACHE_DIR, CACHE_FORMAT_VERSION
from .cifar import load_cifar, read_cifar_pickles
from .digits import load_digits
from .folder import read_image_folder
from .folder_dataset import load_folder
from .loader import ResidentLoader, epoch_generator, random_crop_flip
from .splits import DataSplit, ImageData, cap_test_split, channel_stats, stratified_permutation, subset

__all__ = [
    "CACHE_DIR",
    "CACHE_FORMAT_VERSION",
    "DataSplit",
    "ImageData",
    "ResidentLoader",
    "cap_test_split",
    "channel_stats",
    "epoch_generator",
    "load_cifar",
    "load_digits",
    "load_folder",
    "random_crop_flip",
    "read_cifar_pickles",
    "read_image_folder",
    "stratified_permutation",
    "subset",
]
