"""Command line: ``python -m mirror_sd {generate,bench,sweep,tradeoff,tune,methods,whatif,gpu-check} ...``.

Method options (--gamma, ...) come from the method registry, so a new method's options appear
here without changes to this file. Bad input prints one line, ``error: ...``, and exits with 2.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from .errors import MirrorSDError
from .methods import METHODS, Option
from .tools.tradeoff import DRAFTS, GAMMAS, PROFILES


def _all_options() -> dict[str, list[tuple[str, Option]]]:
    """Every method option name -> the (method, Option) pairs that take it."""
    options: dict[str, list] = {}
    for m in METHODS.values():
        for o in m.options:
            options.setdefault(o.name, []).append((m.name, o))
    return options


def _option_help(users: list[tuple[str, Option]]) -> str:
    """One help text per distinct option; methods named where several share the flag."""
    texts: dict[str, list[str]] = {}
    for method, o in users:
        texts.setdefault(f"{o.help} (default {o.default})", []).append(method)
    if len(texts) == 1:
        return next(iter(texts))
    return "; ".join(f"{'/'.join(methods)}: {text}" for text, methods in texts.items())


def _add_model_args(p: argparse.ArgumentParser):
    g = p.add_argument_group("models and devices")
    g.add_argument("--target", default=None, help="target model: HF id, local folder, or the embedded default")
    g.add_argument("--draft", default=None, help="draft model: HF id, local folder, or 'self:N' (default: the project's draft for the embedded "
                        "target; none for other targets)")
    g.add_argument("--add-on", action="append", default=[], metavar="FOLDER",
                   help="an add-on trained for the target (python -m mirror_sd.train eagle, exit-head or ss): its "
                        "EAGLE head, an early-exit head, or its speculative streams; repeat for several. The embedded "
                        "target's ship with the package; one given here replaces the shipped one of its kind")
    g.add_argument("--target-device", default=None, help="cpu, cuda[:N], mps, npu, or GPUs to shard the target "
                                                             "over: cuda:0,cuda:1 (default: this machine's best)")
    g.add_argument("--draft-device", default=None, help="device of the draft lane (default: see README)")
    g.add_argument("--dtype", default="auto", help="auto, fp32, fp16 or bf16. auto (default): bf16 on a CPU that computes it "
                        "natively (amx_bf16 or avx512_bf16) where a check at load finds its rows exact and faster "
                        "than fp32; fp32 everywhere else. bf16 on a CPU keeps every method equal to vanilla at "
                        "temperature 0; fp16, and bf16 on a GPU, may not")
    g.add_argument("--fp32-drafting", action="store_true", help="draft with fp32 weights on the CPU too (default: int8 "
                                                                     "copies of the drafting weights; lossless either way)")
    g.add_argument("--graphs", choices=("auto", "on", "off"), default="auto",
                   help="run the methods' forwards as fixed-shape stages, captured as CUDA graphs on CUDA lanes and "
                        "run eagerly elsewhere (auto: on for CUDA lanes, off elsewhere)")
    g.add_argument("--buckets", choices=("cheapest", "smallest"), default="cheapest",
                   help="with graphs: run a window at the captured width that holds it and replayed fastest "
                        "when captured (cheapest), or always at the smallest that holds it")
    g.add_argument("--kernels", choices=("tuned", "default"), default="tuned",
                   help="with graphs on a GPU: record each operation of a stage (products, attention, norms, ...) "
                        "in the formulation measured fastest for its shapes when captured (tuned), or as PyTorch's "
                        "default calls (default)")


def _add_decoding_args(p: argparse.ArgumentParser, method_options: bool = True):
    g = p.add_argument_group("decoding")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    for name, users in (_all_options() if method_options else {}).items():
        g.add_argument(f"--{name.replace('_', '-')}", type=users[0][1].kind, default=None, help=_option_help(users))


def _add_search_args(p: argparse.ArgumentParser, out: str, method_options: bool = True):
    """What tradeoff and tune share: one prompt per category, 48 new tokens, an output folder, the
    decoding arguments (``method_options``: with the methods' options) and the model arguments."""
    p.add_argument("--prompts", default=None, help="JSONL file (default: the bundled Spec-Bench-style set)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--per-category", type=int, default=1, help="the first N prompts of each category (default 1)")
    p.add_argument("--out", default=out, help="output folder")
    _add_decoding_args(p, method_options)
    _add_model_args(p)
    p.set_defaults(max_new_tokens=48)


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments get the one line every other bad input gets, ``error: ...``, and exit status 2."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m mirror_sd", description="Speculative decoding, from vanilla to Mirror-SD.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode one prompt with one method")
    gen.add_argument("--method", default="sd", help=f"one of: {', '.join(METHODS)}")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--json", action="store_true", help="print one JSON object: method, text, token_ids, metrics")
    gen.add_argument("--trace", default=None, metavar="FILE.json", help="write the Chrome-trace JSON (opens in Perfetto)")
    _add_decoding_args(gen)
    _add_model_args(gen)

    ben = sub.add_parser("bench", help="benchmark methods on a JSONL prompt set")
    ben.add_argument("--prompts", default=None, help="JSONL file: the bundled Spec-Bench-style set (default), or "
                     "Spec-Bench's own data/spec_bench/question.jsonl as it is")
    ben.add_argument("--methods", default=",".join(METHODS), help="comma-separated, vanilla always runs first")
    ben.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    ben.add_argument("--per-category", type=int, default=None, help="use only the first N prompts of each category")
    ben.add_argument("--out", default="bench-out", help="output folder")
    ben.add_argument("--report", default=None, metavar="FILE.md",
                     help="also write a one-page markdown report: this command, the machine, one row per method")
    ben.add_argument("--traces", default=None, metavar="DIR", help="also write every run's trace JSON into DIR "
                     "(for python -m mirror_sd whatif)")
    _add_decoding_args(ben)
    _add_model_args(ben)

    swp = sub.add_parser("sweep", help="bench one method at several values of one option (vanilla once, same run)")
    swp.add_argument("--method", required=True)
    swp.add_argument("--option", required=True, help="e.g. gamma")
    swp.add_argument("--values", required=True, help="comma-separated, e.g. 1,2,3,4,6")
    swp.add_argument("--prompts", default=None, help="JSONL file (default: the bundled Spec-Bench-style set)")
    swp.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    swp.add_argument("--per-category", type=int, default=None, help="use only the first N prompts of each category")
    swp.add_argument("--out", default="sweep-out", help="output folder")
    _add_decoding_args(swp)
    _add_model_args(swp)

    trd = sub.add_parser("tradeoff", help="drafts of growing capacity: sd and Mirror-SD with each, EAGLE once, "
                         "measured in one run, then re-timed on hardware profiles (MODELLED)")
    trd.add_argument("--drafts", default=",".join(DRAFTS),
                     help="comma-separated drafts, smallest first: default (the pair's), exit:N (the target's first "
                          "N layers and its exit head for layer N), self:N, a folder (default: %(default)s)")
    trd.add_argument("--gammas", default=",".join(map(str, GAMMAS)),
                     help="sd's windows; its best for each draft is kept (default: %(default)s)")
    trd.add_argument("--profiles", default=",".join(PROFILES),
                     help="what-if profiles to re-time on; this-machine is fitted from the run (default: %(default)s)")
    _add_search_args(trd, "tradeoff-out")

    tun = sub.add_parser("tune", help="each method's best settings for each hardware profile: every setting "
                         "measured once here, re-timed on every profile (MODELLED)")
    tun.add_argument("--methods", default="sd,eagle,ss,mirror", help="methods to search (default: %(default)s)")
    tun.add_argument("--profiles", default=None,
                     help="comma-separated what-if profiles; this-machine is fitted from the search's runs "
                          "(default: every shipped profile and this-machine)")
    tun.add_argument("--rounds", type=int, default=1,
                     help="rounds after the coarse grid, each running the neighbours of every profile's best "
                          "(default: %(default)s)")
    _add_search_args(tun, "tune-out", method_options=False)  # tune searches them itself

    sub.add_parser("methods", help="list the decoding methods and their options")

    wif = sub.add_parser("whatif", help="re-time recorded traces on a hardware profile (a model, not a measurement)")
    wif.add_argument("--trace", required=True, nargs="+", metavar="FILE.json",
                     help="trace JSON files (bench --traces, the app's export), or folders of them")
    wif.add_argument("--profile", required=True, help="a shipped profile (see the error for the names) or a profile .json")
    wif.add_argument("--draft-speed", type=float, default=None,
                     help="the draft device's speed relative to the profile's draft figures (default: the profile's)")

    gpu = sub.add_parser("gpu-check", help="on a CUDA GPU: its tests, stage replays, a hardware profile, the bench; "
                         "one report (docs/devices.md)")
    gpu.add_argument("--out", default="gpu-check-out", help="output folder")
    gpu.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                     help="time for every part together; parts it no longer leaves room for are skipped "
                          "(default: one 10-minute device command's worth, with room to unpack)")
    return parser


def _method_options(args) -> dict:
    return {name: getattr(args, name) for name in _all_options() if getattr(args, name, None) is not None}


def _load(args):
    from .models.pair import DEFAULT, load_pair

    return load_pair(target=args.target, draft=args.draft or DEFAULT, target_device=args.target_device,
                     draft_device=args.draft_device, dtype=args.dtype, int8_drafting=not args.fp32_drafting,
                     graphs=args.graphs, buckets=args.buckets, kernels=args.kernels, add_ons=args.add_on)


def _settings(args) -> dict:
    return dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                seed=args.seed, raw=args.raw)


def cmd_generate(args) -> int:
    from .engine import generate
    from .methods import get_method

    from .tools.bench import check_writable

    get_method(args.method)  # fail fast, before loading models
    if args.trace:
        check_writable(args.trace, "--trace")
    pair = _load(args)
    out = generate(pair, args.prompt, method=args.method, **_settings(args), **_method_options(args))
    if args.json:
        print(json.dumps(dict(method=out.method, text=out.text, token_ids=out.token_ids, metrics=out.metrics,
                              finished=out.finished, error=out.error, note=out.note, dtype=str(pair.dtype))))
    else:
        print(out.text)
        m = out.metrics
        rate = "" if m["acceptance_rate"] is None else f", acceptance {m['acceptance_rate']:.2f}"
        print(f"\n[{out.method}] {m['new_tokens']} tokens in {m['wall_s']:.2f} s ({m['tokens_per_s']:.1f} tok/s), "
              f"{m['steps']} steps, mean accepted {m['mean_accepted']:.2f}{rate}, finished: {out.finished}; "
              f"dtype {pair.dtype}", file=sys.stderr)
    if out.note:  # the draft lane failed and the run finished target-only
        print(f"note: {out.note}", file=sys.stderr)
    if args.trace and not _write_trace(out.trace, Path(args.trace)):
        return 1
    if out.error:
        print(f"error: {out.error}", file=sys.stderr)
        return 1
    return 0


def _write_trace(trace, path: Path) -> bool:
    """Write the Chrome-trace JSON after the text is out, so a failed write loses no text."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(trace.to_chrome_trace()))
        return True
    except OSError as e:
        print(f"error: could not write the trace to {path}: {e}", file=sys.stderr)
        return False


def _prompts(args) -> list[dict]:
    from .tools.bench import DEFAULT_PROMPTS, first_per_category, read_prompts

    prompts = read_prompts(args.prompts or DEFAULT_PROMPTS)
    if args.per_category is not None:
        if args.per_category < 1:
            raise MirrorSDError("--per-category must be at least 1")
        prompts = first_per_category(prompts, args.per_category)
    if args.limit is not None:
        if args.limit < 1:
            raise MirrorSDError("--limit must be at least 1")
        prompts = prompts[:args.limit]
    return prompts


def cmd_bench(args) -> int:
    from .tools.bench import bench, check_options_taken, check_writable, equality_warning, write_report
    from .methods import get_method

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        get_method(m)
    check_options_taken(_method_options(args), methods)
    check_writable(args.out, "--out", folder=True)  # before hours of decoding, not after
    if args.report:
        check_writable(args.report, "--report")
    if args.traces:
        check_writable(args.traces, "--traces", folder=True)
    prompts = _prompts(args)
    pair = _load(args)
    summary = bench(pair, prompts, methods, out_dir=args.out, options=_method_options(args), traces_dir=args.traces,
                    **_settings(args))
    print(summary.to_markdown(index=False, floatfmt=".3f"))
    print(summary.attrs.get("whatif", ""), end="")
    print(f"\ndtype {pair.dtype}")
    print(f"wrote {', '.join(sorted(f.name for f in Path(args.out).iterdir() if f.is_file()))} into {args.out}")
    if args.report:
        command = "python -m mirror_sd " + shlex.join(args.argv)
        write_report(args.report, summary, command, pair, len(prompts), args.max_new_tokens)
        print(f"wrote {args.report}")
    warning = equality_warning(summary, args.temperature)
    if warning:
        print(warning, file=sys.stderr)
    return _failed_runs(summary.attrs.get("failed", {}), args.out)


def _failed_runs(failed: dict, out) -> int:
    """2 after naming on stderr each run that failed and was left out (the others' results are
    written); 0 when none did."""
    for name, why in failed.items():
        print(f"error: {name} failed and is left out ({why}); the other runs' results are in {out}", file=sys.stderr)
    return 2 if failed else 0


def cmd_sweep(args) -> int:
    from .tools.bench import check_options_taken, check_writable, sweep
    from .methods import get_method

    method = get_method(args.method)  # fail fast on an unknown method
    option = args.option.replace("-", "_")
    kind = {o.name: o for o in method.options}.get(option)
    if kind is None:
        takes = ", ".join(o.name for o in method.options) or "none"
        raise MirrorSDError(f"method {method.name!r} has no option {args.option!r} (its options: {takes})")
    try:
        values = [kind.kind(v) for v in args.values.split(",") if v.strip()]
    except ValueError:
        raise MirrorSDError(f"--values must be comma-separated numbers, got {args.values!r}") from None
    if not values:
        raise MirrorSDError("--values names no value to sweep: give comma-separated numbers, such as 1,2,4")
    for v in values:
        kind.check(v)
    check_options_taken(_method_options(args), [method.name])
    check_writable(args.out, "--out", folder=True)
    prompts = _prompts(args)
    pair = _load(args)
    table = sweep(pair, prompts, args.method, option, values, out_dir=args.out, options=_method_options(args),
                  **_settings(args))
    print(table.to_markdown(index=False, floatfmt=".3f"))
    html = ", sweep.html" if (Path(args.out) / "sweep.html").exists() else ""
    print(f"\nwrote {args.out}/sweep.csv{html}")
    return _failed_runs({f"{args.method} at {option} {value}": why for value, why in table.attrs["failed"].items()},
                        args.out)


def cmd_tradeoff(args) -> int:
    from .tools.bench import check_options_taken, check_writable
    from .tools.tradeoff import tradeoff
    from .tools.whatif import load_profile

    drafts = [d.strip() for d in args.drafts.split(",") if d.strip()]
    try:
        gammas = [int(g) for g in args.gammas.split(",") if g.strip()]
    except ValueError:
        raise MirrorSDError(f"--gammas must be comma-separated whole numbers, got {args.gammas!r}") from None
    if not drafts or not gammas or min(gammas) < 1:
        raise MirrorSDError("--drafts and --gammas each need at least one value (gammas of 1 or more)")
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    for name in profiles:
        if name != "this-machine":
            load_profile(name)  # fail fast on an unknown profile
    options = _method_options(args)
    check_options_taken(options, ["mirror"])
    check_writable(args.out, "--out", folder=True)
    prompts = _prompts(args)
    pair = _load(args)
    table = tradeoff(pair, prompts, drafts, gammas, out_dir=args.out, profiles=profiles, mirror_options=options,
                     command="python -m mirror_sd " + shlex.join(args.argv), **_settings(args))
    print(table.to_markdown(index=False, floatfmt=".3f"))
    for sentence in table.attrs["sentences"]:
        print(f"- {sentence}")
    print(f"\nwrote {args.out}/tradeoff.csv, modelled.csv, tradeoff.md, tradeoff.html")
    if table.attrs["unequal"]:
        print(f"error: runs {table.attrs['unequal']} committed other tokens than vanilla", file=sys.stderr)
        return 1
    return _failed_runs({f"run {index}": why for index, why in table.attrs["failed"].items()}, args.out)


def cmd_tune(args) -> int:
    from .tools.bench import check_writable
    from .tools.tune import PROFILES, SEARCH, THIS_MACHINE, tune
    from .tools.whatif import load_profile

    methods = [m.strip() for m in args.methods.split(",") if m.strip() and m.strip() != "vanilla"]
    if not methods:
        raise MirrorSDError(f"--methods names nothing to search: give some of {', '.join(SEARCH)}")
    for m in methods:
        if m not in SEARCH:
            raise MirrorSDError(f"--methods: tune searches {', '.join(SEARCH)}, not {m!r}")
    profiles = PROFILES if args.profiles is None else [p.strip() for p in args.profiles.split(",") if p.strip()]
    if not profiles:
        raise MirrorSDError("--profiles names no profile: give shipped profiles or this-machine")
    for name in profiles:
        if name != THIS_MACHINE:
            load_profile(name)  # an unknown name fails here, before any decoding
    if args.rounds < 0:
        raise MirrorSDError("--rounds must be 0 or more")
    if args.temperature != 0:
        raise MirrorSDError("tune runs at temperature 0, where a setting's steps do not depend on the hardware")
    check_writable(args.out, "--out", folder=True)
    prompts = _prompts(args)
    pair = _load(args)
    best = tune(pair, prompts, methods, profiles, rounds=args.rounds, out_dir=args.out,
                command="python -m mirror_sd " + shlex.join(args.argv), **_settings(args))
    print(best[["profile", "method", "setting", "tau", "hit_rate", "speedup", "step_ms"]]
          .to_markdown(index=False, floatfmt=".3f"))
    print(f"\nwrote {args.out}/tuned.csv, searched.csv, tuned.md")
    for setting, why in best.attrs["failed"].items():
        print(f"note: {setting} failed and is left out of the search ({why})", file=sys.stderr)
    if best.attrs["unequal"]:
        print(f"error: {', '.join(best.attrs['unequal'])} committed other tokens than vanilla", file=sys.stderr)
        return 1
    return 0


def cmd_whatif(args) -> int:
    from .tools.whatif import load_profile, table

    profile = load_profile(args.profile)
    if args.draft_speed is not None:
        profile = profile.with_draft_speed(args.draft_speed)
    traces = [_read_trace(path) for path in _trace_files(args.trace)]
    modelled = table(traces, profile).rename(columns={"step_ms": "step ms", "tokens_per_s": "tokens/s",
                                                      "speedup": "speedup vs vanilla"})
    print(f"MODELLED on profile {profile.name!r} (draft speed {profile.draft_speed:g}) from the traces' steps, "
          "not measured; speedup over vanilla modelled on the same profile and tokens.")
    print(modelled.to_markdown(index=False, floatfmt=".3f"))
    return 0


def _trace_files(paths: list[str]) -> list[Path]:
    files = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(path.glob("*.json"))
            if not found:
                raise MirrorSDError(f"--trace folder {path} holds no .json files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise MirrorSDError(f"--trace {path} does not exist")
    return files


def _read_trace(path: Path):
    from .trace import Trace

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MirrorSDError(f"--trace {path}: not readable JSON ({e})") from None
    if isinstance(data, dict) and "traceEvents" in data:
        raise MirrorSDError(f"--trace {path} is a Chrome trace (for Perfetto); whatif reads the trace JSON that "
                            "bench --traces and the app's export write")
    if not isinstance(data, dict) or not {"method", "steps", "spans"} <= set(data):
        raise MirrorSDError(f"--trace {path}: not a trace JSON (needs method, steps, spans)")
    try:
        return Trace.from_dict(data)
    except (TypeError, KeyError, ValueError) as e:
        raise MirrorSDError(f"--trace {path}: malformed trace ({e})") from None


def cmd_gpu_check(args) -> int:
    from .tools.gpu_check import BUDGET_S, gpu_check

    return gpu_check(Path(args.out), BUDGET_S if args.budget is None else args.budget)


def cmd_methods(args) -> int:
    for m in METHODS.values():
        opts = ", ".join(f"--{o.name.replace('_', '-')} (default {o.default}{_scope(o)})" for o in m.options)
        opts = opts or "no options"
        print(f"{m.name:10s} {m.title}: {m.summary}. Options: {opts}")
    return 0


def _scope(option) -> str:
    """When an option applies: with one drafter only, at temperature 0 only."""
    where = [f"with --{option.only_with[0]} {option.only_with[1]}"] if option.only_with else []
    return "".join(f"; {w}" for w in where + (["temperature 0 only"] if option.greedy_only else []))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or bad arguments (after their one line): the status, as for any command
        return e.code
    args.argv = argv  # as given, for the report's command line
    try:
        commands = {"generate": cmd_generate, "bench": cmd_bench, "sweep": cmd_sweep, "methods": cmd_methods,
                    "whatif": cmd_whatif, "gpu-check": cmd_gpu_check, "tradeoff": cmd_tradeoff,
                    "tune": cmd_tune}
        return commands[args.command](args)
    except MirrorSDError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
