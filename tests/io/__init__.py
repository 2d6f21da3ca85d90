"""Tests of datamask.io."""
