"""Tests of datamask.pipeline."""
