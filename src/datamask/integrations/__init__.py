"""Integrations with other data tools; each is imported on its own and needs its extra.

* :mod:`datamask.integrations.datatrove`: pipeline steps (``pip install datamask[datatrove]``).
* :mod:`datamask.integrations.curator`: a NeMo Curator workflow (``pip install datamask[curator]``).
"""
