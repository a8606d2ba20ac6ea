"""Start the app: ``python -m app [--host 127.0.0.1] [--port 7860]``."""
import argparse
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def main():
    parser = argparse.ArgumentParser(prog="python -m app", description="mirror-sd: decoding methods side by side")
    parser.add_argument("--host", default=os.environ.get("MIRROR_SD_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("MIRROR_SD_PORT", "7860")))
    args = parser.parse_args()
    from .ui import serve

    serve(args.host, args.port)


if __name__ == "__main__":
    main()
