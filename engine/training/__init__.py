"""`vitsee train`: small timm classifiers with the paper's interventions, crash-safe and resumable.

    train.py   the run: its config and record, the recipes per family, checkpoints, resumption

May import: models, data, the store's lock, threads. Never extraction, the output or the CLI.
"""
