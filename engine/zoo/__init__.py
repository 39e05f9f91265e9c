"""The zoo: many models over the same images, which is like which and which layer of one is which of another.

    summaries.py  the numbers: a pair's summary of a layer x layer joint matrix (best match, one layer), the
                  models x models matrix, its clustering, layer correspondences, and their intervals
    streamed.py   the Grams a zoo extraction (`vitsee extract --grams`) streams per batch, from which the CKA of
                  any pair of models is had without their activations

May import: the store, stats. The zoo as an analysis (its view, its options) is analyses/zoo.py.
"""
