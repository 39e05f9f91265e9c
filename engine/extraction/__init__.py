"""One pass of the images through the models into a store, and a store from features another tool extracted.

    plan.py        the extraction config, the per-model plan and every check made before anything is written
    extract.py     the pass itself: one batch feeds every model, hooks record, a writer stores
    recorders.py   what a forward pass records through hooks: activations, per-image statistics, head outputs
    writer.py      device-to-host copies on a side stream and the background writer thread (GPU runs)
    run_config.py  the run a store records, and resuming it from the store alone
    distributed.py torchrun: one process per device over disjoint image ranges
    shards.py      stitching the shards of a torchrun extraction into one store (HDF5 virtual datasets)
    features.py    `vitsee.from_features`: a store written from arrays

May import: the store, models, data, the zoo's streamed Grams and the analyses whose accumulators stream during a
pass (CKA, head-level CKA, attention distances). Never the output, the library or the CLI.
"""
