"""The package's version, in a module of its own: the writer stamps it into every summary,
and ``datamask --version`` prints it, without importing the package's entry points."""

__version__ = "0.1.0"
