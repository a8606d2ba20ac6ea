"""The Gradio app: renders real runs of the mirror-sd engine (see ui.py)."""
