"""The engine installs as a package: built from pyproject.toml into a folder outside the clone, it
imports and runs its command line from another directory, with its shipped assets."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_installs_and_runs_from_another_directory(tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(ROOT)], check=True, cwd=tmp_path, timeout=600)
    assert (target / "mirror_sd" / "assets" / "draft-smollm2-135m" / "config.json").exists()
    assert (target / "mirror_sd" / "data" / "bench_prompts.jsonl").exists()
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = ("import mirror_sd, pathlib; from mirror_sd.models.exit_head import embedded_exit_heads; "
            "print(pathlib.Path(mirror_sd.__file__).parent); print(sorted(embedded_exit_heads()))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, check=True).stdout.splitlines()
    assert Path(out[0]) == target / "mirror_sd"  # the installed copy, not the clone
    assert out[1] == "[3, 6, 10, 14, 18, 22]"
    methods = subprocess.run([sys.executable, "-m", "mirror_sd", "methods"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300, check=True).stdout
    for name in ("vanilla", "sd", "eagle", "ss", "mirror"):
        assert name in methods
