"""Start the app: ``python -m app [--host 127.0.0.1] [--port 7860] [--target T --draft D --add-on FOLDER ...]``."""
import argparse
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def pair_factory(target: str | None, draft: str | None, add_ons: list[str]):
    """What loads the models the app races (``build_demo``'s ``pair_factory``): None for the embedded
    pair, else ``load_pair`` with these models on the devices the page picks."""
    if target is None and draft is None and not add_ons:
        return None
    from mirror_sd import load_pair
    from mirror_sd.models.pair import DEFAULT

    def load(target_device=None, draft_device=None):
        return load_pair(target=target, draft=draft or DEFAULT, target_device=target_device,
                         draft_device=draft_device, add_ons=add_ons)
    return load


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m app", description="mirror-sd: decoding methods side by side")
    parser.add_argument("--host", default=os.environ.get("MIRROR_SD_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("MIRROR_SD_PORT", "7860")))
    parser.add_argument("--target", default=None,
                        help="target model: HF id or local folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default=None, help="draft model: HF id, local folder or 'self:N' (default: the "
                                                      "project's draft for the embedded target, none for others)")
    parser.add_argument("--add-on", action="append", default=[], metavar="FOLDER",
                        help="an EAGLE head, early-exit head or streams trained for --target (python -m "
                             "mirror_sd.train ... --target); repeat for several")
    args = parser.parse_args(argv)
    from .ui import serve

    serve(args.host, args.port, pair_factory(args.target, args.draft, args.add_on))


if __name__ == "__main__":
    main()
