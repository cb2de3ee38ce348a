"""What ``bench.real_model`` reads of a run (``generated``, ``model_path``), which live in
``bench.measures`` now; kept until the real-model study is a file."""

from bench.measures import generated, model_path

__all__ = ["generated", "model_path"]
