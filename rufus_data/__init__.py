"""rufus_data: canonical sources, token-share mixtures, decontamination, filtering, pairs, rewards."""

__version__ = "0.1.0"
