"""The GPU tests' simulated fleets serve the metrics tests too."""

from tests.gpus.conftest import make_fleet

__all__ = ["make_fleet"]
