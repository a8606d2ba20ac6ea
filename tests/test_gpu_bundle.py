"""scripts/gpu_bundle.py: what gpu-check needs, carried to a GPU machine in parts that fit its calls,
on a repository of its own (the project's index is never touched here)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from scripts import gpu_bundle as gb

MiB = 2**20


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "assets").mkdir(parents=True)
    (repo / "small.py").write_text("print('small')\n")
    (repo / ".gitignore").write_text("/.gpu/\n")
    (repo / "assets" / "big.bin").write_bytes(os.urandom(MiB + MiB // 2))  # [1.5 MiB]
    (repo / "assets" / "head.bin").write_bytes(os.urandom(1000))
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "assets")
    return repo


def test_parts_fit_beside_the_tree_and_unpack_to_the_same_files(repo, tmp_path):
    package = tmp_path / "llm_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("import llm\n")
    (package / "model.gguf").write_bytes(os.urandom(5000))
    files = gb.payload(repo, big=MiB, package_dir=package)
    assert [name for _, name in files] == ["repo/assets/big.bin", "site/llm_pkg/__init__.py", "site/llm_pkg/model.gguf"]

    tree = sum(gb.tracked_sizes(repo).values()) - (MiB + MiB // 2)  # what stays in the index
    limit, margin = tree + 4096 + MiB + 4096, 4096  # room for a bit over 1 MiB beside the tree
    parts = gb.pack(repo, files, limit=limit, margin=margin)
    assert [p.name for p in parts] == ["1", "2"]
    travels = gb.tracked_sizes(repo)  # the tree a call carries: the big asset and the parts stay out
    assert "assets/big.bin" not in travels and not any(n.startswith(".gpu") for n in travels)
    for part in parts:
        assert sum(travels.values()) + sum(f.stat().st_size for f in part.iterdir()) <= limit - margin
    with pytest.raises(SystemExit, match="restore"):
        gb.pack(repo, files, limit=limit, margin=margin)
    commit = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                            capture_output=True, text=True)
    assert commit.returncode != 0 and "restore before committing" in commit.stderr  # would delete the assets

    machine, store = tmp_path / "machine", tmp_path / "store"  # the tree as a call copies it, and /tmp there
    for name in travels:
        (machine / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo / name, machine / name)
    for part in parts:
        gb.receive(part, store)
    site = gb.unpack(machine, store)
    assert (machine / "assets" / "big.bin").read_bytes() == (repo / "assets" / "big.bin").read_bytes()
    assert (site / "llm_pkg" / "model.gguf").read_bytes() == (package / "model.gguf").read_bytes()

    assert gb.restore(repo) == ["assets/big.bin"]
    assert "assets/big.bin" in git(repo, "ls-files") and git(repo, "status", "--porcelain") == ""
    assert not gb.packed(repo) and not (repo / ".gpu").exists() and not (repo / ".git/hooks/pre-commit").exists()


def test_unpack_refuses_a_missing_or_damaged_part(repo, tmp_path):
    files = gb.payload(repo, big=MiB)
    tree = sum(gb.tracked_sizes(repo).values()) - (MiB + MiB // 2)
    parts = gb.pack(repo, files, limit=tree + 2 * 4096 + MiB, margin=4096)
    store = tmp_path / "store"
    gb.receive(parts[-1], store)
    with pytest.raises(SystemExit, match="part 1 of 2 never arrived"):
        gb.unpack(tmp_path / "machine", store)
    (parts[0] / gb.PART).write_bytes(b"x" + (parts[0] / gb.PART).read_bytes()[1:])
    gb.receive(parts[0], store)
    with pytest.raises(SystemExit, match="sha256"):
        gb.unpack(tmp_path / "machine", store)
    gb.restore(repo)
    assert git(repo, "status", "--porcelain") == ""


def test_the_calls_carry_one_part_each_and_the_last_runs_gpu_check(tmp_path):
    parts = [tmp_path / ".gpu" / str(k) for k in (1, 2, 3)]
    calls = gb.calls(parts, tmp_path).splitlines()
    assert len(calls) == 3 and all(f'carry=[".gpu/{k}"]' in c for k, c in zip((1, 2, 3), calls))
    assert "gpu-check" not in calls[0] and "unpack" in calls[2] and "gpu-check --out" in calls[2]


def test_a_call_on_the_warm_machine_unpacks_again_then_sweeps():
    again = gb.call_again()
    assert again.startswith("run(command='python3 scripts/gpu_bundle.py unpack") and "PYTHONPATH=" in again
    assert again.count("sweep --method") == 1 and '"eagle-total_tokens|total_tokens 7,8"' in again
    assert again.count("'") == 2  # the command's own quotes only
    assert again.endswith("tar -czf $OUT/sweeps.tgz -C /tmp sweeps; done', timeout_s=500)")  # one file, after each
    assert len(again) < gb.COMMAND_LIMIT


def test_the_last_call_can_run_another_command_within_the_devices_limit(tmp_path):
    parts = [tmp_path / ".gpu" / "1"]
    assert gb.calls(parts, tmp_path, run="python3 -m mirror_sd sweep --method mirror").count("sweep --method") == 1
    with pytest.raises(SystemExit, match="over the device's 2000"):
        gb.calls(parts, tmp_path, run="x" * 2000)
