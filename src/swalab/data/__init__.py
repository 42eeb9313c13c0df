"""Data for swalab: in-memory image data sets and a GPU-resident augmenting loader.

Loaders return an :class:`ImageData` (two ``uint8`` :class:`DataSplit` tensors plus class names);
:class:`ResidentLoader` moves a split to the training device once and yields normalised, augmented
batches. :func:`load_digits` needs nothing but scikit-learn and is the offline default;
:func:`load_cifar` reads CIFAR-10/100 from torchvision's pickles or from an image folder;
:func:`load_folder` reads any image folder (``train/<class>/*``, ``test/<class>/*``).

Every loader takes the same caps, the ``dataset.*`` keys of those names (conf/dataset): ``val_size`` holds that many
training images (or that fraction) out first as a validation split, class-stratified and the same for every seed
(:func:`swalab.data.splits.hold_out`); ``train_size`` keeps a subset of the rest seeded by ``seed`` (the run seed,
which picks nothing else; :func:`subset`); ``test_size`` keeps a class-stratified subset of the test split drawn
with the fixed seed 0, never ``seed``, so every seed is scored on the same images (:func:`cap_test_split`); ``None``
keeps all; from a folder only the chosen files are decoded. ``cache_dir`` is ``run.cache_dir`` (None: the user's
cache directory), and ``record`` the record of the files (the loader's ``files_record``,
:func:`swalab.data.fingerprint.records_files`) when the caller has just made it, so that they are not read twice."""

from .cifar import load_cifar
from .digits import load_digits
from .folder import read_image_folder
from .folder_dataset import load_folder
from .loader import ResidentLoader, random_crop_flip
from .splits import DataSplit, ImageData, cap_test_split, channel_stats, subset

__all__ = ["DataSplit", "ImageData", "ResidentLoader", "cap_test_split", "channel_stats", "load_cifar", "load_digits",
           "load_folder", "random_crop_flip", "read_image_folder", "subset"]
