"""What `import vitsee` hands out (the names are exported by engine/__init__.py, the package `vitsee`).

    store.py     `vitsee.open` and the Store it returns: what a store holds, and its views as Results
    result.py    `vitsee.Result`: one view's numbers, labelled, with intervals, p-values, a table and a figure
    run.py       `vitsee.extract` and `vitsee.train`: the CLI's long-running commands as functions
    features.py  `vitsee.from_features`: a store from another tool's activations
    progress.py  the engine's progress events as notebook progress bars and warnings

May import every room below it; never the CLI or the app.
"""
