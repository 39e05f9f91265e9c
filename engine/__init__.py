"""vitsee.engine: models, data, extraction, the HDF5 store and the analyses. No UI imports here."""
