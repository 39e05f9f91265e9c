"""The measures of how alike two layers are, one module each: its formula (the direct form, two layers' features
-> a float), its all-pairs form over the layers' shared Grams, its parameters with their defaults, checks and
help, and its words. Importing this package imports every module in it, and each module's `Measure` subclass
registers itself (measures/registry.py): a new measure is a new module here, found by being there
(measures/README.md).

    linear_cka.py  linear CKA over all images (its view is engine/analyses/cka.py's minibatch estimate)
    rbf_cka.py     CKA with a Gaussian kernel (Kornblith et al. 2019)
    procrustes.py  angular Procrustes distance, partial whitening (Williams et al. 2021)
    svcca.py       SVCCA (Raghu et al. 2017), and the SVD step, CCA and pair loop PWCCA shares
    pwcca.py       projection-weighted CCA (Morcos et al. 2018)
    mknn.py        mutual k-nearest-neighbour alignment (Huh et al. 2024)
    cknna.py       centred kernel nearest-neighbour alignment (Huh et al. 2024)
    rsa.py         representational similarity analysis (Kriegeskorte et al. 2008)
    soft_matching.py        soft matching of the layers' units by optimal transport (Khosla & Williams 2024)
    linear_predictivity.py  cross-validated ridge R^2 of one layer from another (brain-score; Wu et al. 2025)
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
