"""Tools that the app, gpu-check and the docs' how-tos run, from the repository root as
``python -m scripts.NAME``: record_races (the app's recorded races), gpu_bundle (gpu-check's files carried
to a GPU machine), best_settings, step_costs and whatif_check (tables over a bench's or a GPU session's
folder). Nothing under mirror_sd/ or app/ imports them. The research scripts behind docs/experiments
are in research/.
"""
