"""`vitsee.measures`: how alike two layers are, for arrays you already have (rows = images, any trailing shape).

    from vitsee.measures import rbf_cka, procrustes, svcca, pwcca, mknn, cknna, rsa, linear_cka
    from vitsee.measures import soft_matching, linear_predictivity
    rbf_cka(x, y, threshold=0.5)   # x (n, ...) and y (n, ...): numpy arrays or torch tensors, on any device

Each function returns a Python float and documents its formula, invariances and reference; they are the direct
forms of the measures the store's analyses compute, re-exported here as the promised names. The room's map:

    catalog/       one module per measure: its direct and all-pairs forms, its parameters, its words; registered
                   by being there (catalog/__init__.py lists them; README.md: adding one)
    registry.py    what a measure declares (Measure, Parameter) and the registry that finds it by name
    kernels.py     what the measures share: their inputs and conventions, small kernels on Gram matrices
    grams.py       one n x n Gram per layer (LayerGrams), built once and shared by every measure's all-pairs form;
                   `pairwise(grams_a, grams_b, name)` for any registered measure
    resampling.py  bootstrap intervals and permutation p-values of any registered measure over the same Grams
    curves.py      any measure against the number of images (nested seeded subsets) or k, with intervals

engine/analyses/similarity.py makes every registered measure (but linear CKA) a layer x layer analysis.
"""

from vitsee.measures import catalog  # noqa: F401  (every measure registers itself)
from vitsee.measures.catalog.cknna import cknna
from vitsee.measures.catalog.linear_cka import linear_cka
from vitsee.measures.catalog.linear_predictivity import linear_predictivity
from vitsee.measures.catalog.mknn import mknn
from vitsee.measures.catalog.procrustes import procrustes
from vitsee.measures.catalog.pwcca import pwcca
from vitsee.measures.catalog.rbf_cka import rbf_cka
from vitsee.measures.catalog.rsa import rsa
from vitsee.measures.catalog.soft_matching import soft_matching
from vitsee.measures.catalog.svcca import svcca

__all__ = [
    "linear_cka",
    "rbf_cka",
    "procrustes",
    "svcca",
    "pwcca",
    "mknn",
    "cknna",
    "rsa",
    "soft_matching",
    "linear_predictivity",
]
