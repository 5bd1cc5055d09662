"""pytest configuration of the Python API tests.

Run: PYTHONPATH=<repo>/python RAILYARD_EXTENSION_DIR=<build>/python/railyard \
     python -m pytest tests/python
Tests that need railyard skip when it cannot be imported; test_reference.py needs
only torch.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Keep CPU threads few: the simulator already runs one thread per rank.
torch.set_num_threads(1)


@pytest.fixture
def railyard():
    from helpers import import_railyard

    return import_railyard()
