"""timm models by spec: what vitsee loads, how it recognises a family, and which layers it records.

    load.py           `NAME[.TAG][@WEIGHTS]` specs, weights (the Hub or its cache, a local file, a seeded init, a
                      `vitsee train` record), family recognition (ViT, ResNet, Mixer, Swin), layer points in
                      forward order, timm's eval transform, model lists and their weights status
    interventions.py  the paper's training interventions around timm's modules (residual adds removed, CLS or GAP)
    init_notes.py     why a randomly initialised timm CNN looks degenerate (its residual branches start near zero)

May import: errors, lazy, threads, data. Never the store, the analyses or anything above them.
"""
