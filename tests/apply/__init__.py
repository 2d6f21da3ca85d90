"""Tests of datamask.applying and the apply door."""
