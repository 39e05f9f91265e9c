"""What a view becomes outside the app: a figure for a paper, a terminal rendering, a file of numbers.

    figures.py   PNG figures of every view shape (matplotlib's object API on an Agg canvas)
    render.py    `vitsee show`: Rich renderables of every view shape
    export.py    writing a view to .png, .json or .csv
    colormap.py  quantised sequential colormaps that keep their order on any terminal
    labels.py    layer names shortened alike for narrow places (axes, gutters)

May import: the analyses' contract and views. Never the CLI, the library or the app.
"""
