"""Integrations with other data tools; each is imported on its own and needs its extra.

* :mod:`datamask.integrations.datatrove`: pipeline steps (``pip install datamask[datatrove]``).
"""
