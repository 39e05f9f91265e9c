"""`vitsee.measures`: how alike two layers are, for arrays you already have (rows = images, any trailing shape).

    from vitsee.measures import rbf_cka, procrustes, svcca, pwcca, mknn, cknna, rsa, linear_cka
    rbf_cka(x, y, threshold=0.5)   # x (n, ...) and y (n, ...): numpy arrays or torch tensors, on any device

Each function returns a Python float and documents its formula, invariances and reference; they are the
functions the store's analyses call (vitsee.measures.direct), re-exported here as the promised names.
"""

from vitsee.measures.direct import __all__, cknna, linear_cka, mknn, procrustes, pwcca, rbf_cka, rsa, svcca  # noqa: F401
