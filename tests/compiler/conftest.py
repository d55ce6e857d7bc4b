"""Fixtures shared by the compiler tests: the digits CNN's training module and its data
split (``models/digits/train.py``)."""

import pytest

from .test_digits import load_train_module


@pytest.fixture(scope="module")
def digits():
    return load_train_module()


@pytest.fixture(scope="module")
def split(digits):
    return digits.load_split()
